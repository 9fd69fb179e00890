/*
 * main.c: the `openmesh` command. Each subcommand is a function taking
 * argc/argv after the subcommand name; exit codes are 0 ok, 1 runtime
 * failure, 2 usage or invalid input.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "om_cli.h"
#include "om_cmds.h"
#include "om_lua.h"

static int cmd_version(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("openmesh %s\n", OM_VERSION);
  return OM_EXIT_OK;
}

static const om_cli_command_t commands[] = {
    {"check", "validate policy files as hot reload does", om_cmd_check},
    {"control", "the control plane: registry, discovery, watches, config",
     om_cmd_control},
    {"egress", "the model-call gateway: retries, fallback, degradation",
     om_cmd_egress},
    {"proxy", "the data plane: policy, admission, retries, circuits",
     om_cmd_proxy},
    {"register", "keep an instance's lease alive (and run it)",
     om_cmd_register},
    {"replay", "what a policy change would move, from an access log",
     om_cmd_replay},
    {"test", "run busted specs inside the embedded runtime", om_cmd_test},
    {"up", "run the mesh on its embedded default (examples/)", om_cmd_up},
    {"version", "print the version", cmd_version},
    {NULL, NULL, NULL},
};

static void usage(FILE *out) {
  fprintf(out, "usage: openmesh COMMAND [ARGS...]\n\ncommands:\n");
  for (const om_cli_command_t *c = commands; c->name != NULL; c++)
    fprintf(out, "  %-10s %s\n", c->name, c->summary);
  fprintf(out, "\n`openmesh COMMAND --help` describes each command.\n"
               "exit codes: 0 ok, 1 runtime failure, 2 usage or invalid "
               "input\n");
}

int main(int argc, char **argv) {
  /* A peer that resets a connection must not kill the process: libuv writes
   * with writev, which raises SIGPIPE; the write's error is enough. */
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    usage(stderr);
    return OM_EXIT_USAGE;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
      strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return OM_EXIT_OK;
  }
  if (strcmp(argv[1], "--version") == 0)
    return cmd_version(0, NULL);
  for (const om_cli_command_t *c = commands; c->name != NULL; c++)
    if (strcmp(argv[1], c->name) == 0)
      return c->run(argc - 1, argv + 1);
  fprintf(stderr, "openmesh: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return OM_EXIT_USAGE;
}
