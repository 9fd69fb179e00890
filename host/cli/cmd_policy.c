/*
 * cmd_policy.c: `openmesh check` (validate policies exactly as hot reload
 * does) and `openmesh test` (busted inside the embedded runtime).
 */
#include "om_cmds.h"

#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lualib.h>
#include <xxhash.h>

#include "om_cli.h"
#include "om_lua.h"
#include "om_paths.h"
#include "om_policy.h"

static void check_usage(FILE *out) {
  fprintf(out,
          "usage: openmesh check [--lib-dir DIR] [FILE...]\n\n"
          "Validate policy files exactly as hot reload does: compile in a\n"
          "sandbox, check the shape, run every example. Prints one line per\n"
          "file: 'ok FILE NAME VERSION' (VERSION: hash of the file's\n"
          "content; fields separated by one space) or 'FILE:LINE: message'.\n"
          "Without FILEs, checks policies/*.lua.\n\n"
          "exit: 0 all valid, 2 any invalid or usage error\n");
}

/* Hex XXH3-64 of a file's content: the version `check` reports. */
static int file_version(const char *path, char out[17]) {
  FILE *f = fopen(path, "rb");
  XXH3_state_t *st;
  char buf[65536];
  size_t n;
  if (f == NULL)
    return -1;
  st = XXH3_createState();
  if (st == NULL) {
    fclose(f);
    return -1;
  }
  XXH3_64bits_reset(st);
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    XXH3_64bits_update(st, buf, n);
  fclose(f);
  snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(st));
  XXH3_freeState(st);
  return 0;
}

static int check_one(const om_policy_opts_t *opts, const char *path) {
  char err[4096], version[17];
  om_policy_t *p = NULL;
  int rc = om_policy_load_file(opts, path, &p, err, sizeof err);
  if (rc != 0) {
    printf("%s\n", err);
    return 0;
  }
  if (file_version(path, version) != 0)
    snprintf(version, sizeof version, "unknown");
  printf("ok %s %s %s\n", path, om_policy_name(p), version);
  om_policy_free(p);
  return 1;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The default set: every .lua file in dir, sorted. */
static int check_dir(const om_policy_opts_t *opts, const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char **names = NULL;
  size_t n = 0, cap = 0;
  int ok = 1;
  if (d == NULL) {
    fprintf(stderr, "openmesh check: cannot open %s/ (give FILEs)\n", dir);
    return 0;
  }
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len < 5 || strcmp(e->d_name + len - 4, ".lua") != 0)
      continue;
    if (n == cap) {
      char **nn = realloc(names, (cap = cap ? cap * 2 : 16) * sizeof *nn);
      if (nn == NULL)
        break;
      names = nn;
    }
    names[n] = malloc(strlen(dir) + len + 2);
    if (names[n] == NULL)
      break;
    sprintf(names[n], "%s/%s", dir, e->d_name);
    n++;
  }
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  for (size_t i = 0; i < n; i++) {
    ok &= check_one(opts, names[i]);
    free(names[i]);
  }
  free(names);
  return ok;
}

int om_cmd_check(int argc, char **argv) {
  static const struct option longopts[] = {
      {"lib-dir", required_argument, NULL, 'L'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  om_policy_opts_t opts = {.lib_dir = om_lib_dir()};
  int c, ok = 1;
  optind = 1;
  while ((c = getopt_long(argc, argv, "hL:", longopts, NULL)) != -1) {
    switch (c) {
    case 'L':
      opts.lib_dir = optarg;
      break;
    case 'h':
      check_usage(stdout);
      return OM_EXIT_OK;
    default:
      check_usage(stderr);
      return OM_EXIT_USAGE;
    }
  }
  if (optind == argc)
    ok = check_dir(&opts, "policies");
  for (int i = optind; i < argc; i++)
    ok &= check_one(&opts, argv[i]);
  return ok ? OM_EXIT_OK : OM_EXIT_USAGE;
}

static void test_usage(FILE *out) {
  fprintf(out,
          "usage: openmesh test [--lib-dir DIR] [DIR|FILE...] [-- BUSTED "
          "ARGS]\n\n"
          "Run busted specs (default: spec/) inside the embedded runtime, so\n"
          "specs exercise the same sandbox and C core as production: `require\n"
          "\"openmesh\"` is the module linked into this binary.\n\n"
          "exit: 0 all specs passed, 1 any failed, 2 usage error\n");
}

/*
 * busted exits 1 both on failing specs and on its own usage errors (a bad
 * flag after --). Ours are 0 passed, 1 failures, 2 usage: a non-zero exit
 * before the specs started running is a usage error, 2.
 */
static const char exit_codes[] =
    "local compat = require 'busted.compatibility'\n"
    "local real_exit, real_require, ran = compat.exit, require, false\n"
    "compat.exit = function(code, force)\n"
    "  if code ~= 0 and code ~= true and not ran then os.exit(2, true) end\n"
    "  return real_exit(code, force)\n"
    "end\n"
    "require = function(name, ...)\n"
    "  if name == 'busted.execute' then ran = true end\n"
    "  return real_require(name, ...)\n"
    "end\n";

/* pmain-style: everything that touches Lua runs protected. */
static int run_busted(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = lua_touserdata(L, 2);
  const char *lib_dir = lua_tostring(L, 3);
  luaL_openlibs(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_openmesh);
  lua_setfield(L, -2, "openmesh");
  lua_pop(L, 1);
  lua_getglobal(L, "package"); /* our library first, then the system's */
  lua_pushfstring(L, "%s/?.lua;", lib_dir);
  lua_getfield(L, -2, "path");
  lua_concat(L, 2);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
  lua_createtable(L, argc, 1); /* arg, as lua.c builds it */
  lua_pushstring(L, "openmesh-test");
  lua_rawseti(L, -2, 0);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setglobal(L, "arg");
  if (luaL_loadstring(L, exit_codes) != LUA_OK)
    return lua_error(L);
  lua_call(L, 0, 0);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "busted.runner");
  lua_call(L, 1, 1);
  lua_createtable(L, 0, 1);
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "standalone");
  lua_call(L, 1, 0); /* exits the process with busted's status */
  return 0;
}

static int test_usage_error(char **bargs) {
  free(bargs);
  test_usage(stderr);
  return OM_EXIT_USAGE;
}

/*
 * Specs that start processes (openmesh.testing's mesh) find the binary in
 * OPENMESH_BIN: point it at this one unless the caller chose another.
 */
static void expose_binary(void) {
  char self[4096];
  ssize_t len;
  if (getenv("OPENMESH_BIN") != NULL)
    return;
  len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0)
    return;
  self[len] = '\0';
  setenv("OPENMESH_BIN", self, 0);
}

int om_cmd_test(int argc, char **argv) {
  const char *lib_dir = om_lib_dir();
  char **bargs = calloc((size_t)argc + 2, sizeof *bargs);
  int n = 0, paths = 0, status;
  lua_State *L;
  if (bargs == NULL)
    return OM_EXIT_FAILURE;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      test_usage(stdout);
      free(bargs);
      return OM_EXIT_OK;
    }
    if (strcmp(argv[i], "--lib-dir") == 0) {
      if (i + 1 == argc) {
        fprintf(stderr, "openmesh test: --lib-dir needs a directory\n");
        return test_usage_error(bargs);
      }
      lib_dir = argv[++i];
      continue;
    }
    if (strcmp(argv[i], "--") == 0) {
      for (i++; i < argc; i++)
        bargs[n++] = argv[i];
      break;
    }
    if (argv[i][0] == '-') {
      fprintf(stderr,
              "openmesh test: unknown option '%s' (busted's own options go "
              "after --)\n",
              argv[i]);
      return test_usage_error(bargs);
    }
    if (access(argv[i], F_OK) != 0) {
      fprintf(stderr, "openmesh test: %s: no such file or directory\n",
              argv[i]);
      return test_usage_error(bargs);
    }
    bargs[n++] = argv[i];
    paths++;
  }
  if (paths == 0 && access("spec", F_OK) != 0) {
    fprintf(stderr, "openmesh test: no spec/ here (give DIRs or FILEs)\n");
    return test_usage_error(bargs);
  }
  if (paths == 0)
    bargs[n++] = "spec";
  expose_binary();
  L = luaL_newstate();
  if (L == NULL) {
    free(bargs);
    return OM_EXIT_FAILURE;
  }
  lua_pushcfunction(L, run_busted);
  lua_pushinteger(L, n);
  lua_pushlightuserdata(L, bargs);
  lua_pushstring(L, lib_dir);
  status = om_lua_pcall(L, 3, 0);
  if (status != LUA_OK)
    fprintf(stderr, "openmesh test: %s\n", lua_tostring(L, -1));
  lua_close(L);
  free(bargs);
  return status == LUA_OK ? OM_EXIT_OK : OM_EXIT_FAILURE;
}
