/*
 * om_proxy_static.c: the static topology of `openmesh proxy --static FILE`
 * (see om_proxy.h for the document). Parsed with jansson (strict UTF-8,
 * duplicate keys refused), every instance validated with the snapshot
 * model (om_snapshot_new) and every URL with the upstream client's rules,
 * so what the proxy runs on passed the same checks a snapshot from the
 * control plane will. Errors name the field by its JSON path.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "om_errno.h"
#include "om_proxy.h"

void om_proxy_static_free(om_snapshot_t **snaps, size_t n) {
  if (snaps == NULL)
    return;
  for (size_t i = 0; i < n; i++)
    om_snapshot_unref(snaps[i]);
  free(snaps);
}

static void instances_clear(om_instance_t *in, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(in[i].metadata); /* the strings are borrowed from the JSON */
  free(in);
}

/*
 * One instance object into *in, borrowing strings from the JSON tree.
 * Returns 0, or OM_EINVAL/OM_ENOMEM with err naming the field.
 */
static int parse_instance(json_t *o, const char *path, om_instance_t *in,
                          char *err, size_t errlen) {
  const char *key;
  json_t *v;
  memset(in, 0, sizeof *in);
  in->weight = 1.0;
  in->ttl_ms = 3600000u; /* no lease: static peers stay */
  if (!json_is_object(o)) {
    om_errbuf(err, errlen, "%s: must be an object", path);
    return OM_EINVAL;
  }
  json_object_foreach(o, key, v) {
    if (strcmp(key, "id") == 0 || strcmp(key, "url") == 0) {
      if (!json_is_string(v)) {
        om_errbuf(err, errlen, "%s.%s: must be a string", path, key);
        return OM_EINVAL;
      }
      if (key[0] == 'i')
        in->id = (char *)json_string_value(v);
      else
        in->url = (char *)json_string_value(v);
    } else if (strcmp(key, "weight") == 0) {
      if (!json_is_number(v)) {
        om_errbuf(err, errlen, "%s.weight: must be a number", path);
        return OM_EINVAL;
      }
      in->weight = json_number_value(v);
    } else if (strcmp(key, "zone") == 0) {
      if (!json_is_string(v) && !json_is_null(v)) {
        om_errbuf(err, errlen, "%s.zone: must be a string or null", path);
        return OM_EINVAL;
      }
      in->zone = json_is_string(v) ? (char *)json_string_value(v) : NULL;
    } else if (strcmp(key, "metadata") == 0) {
      const char *mk;
      json_t *mv;
      size_t k = 0;
      if (json_is_null(v))
        continue;
      if (!json_is_object(v)) {
        om_errbuf(err, errlen, "%s.metadata: must be an object of strings",
                  path);
        return OM_EINVAL;
      }
      if (json_object_size(v) > 0) {
        in->metadata = calloc(json_object_size(v), sizeof *in->metadata);
        if (in->metadata == NULL)
          return OM_ENOMEM;
      }
      json_object_foreach(v, mk, mv) {
        if (!json_is_string(mv)) {
          om_errbuf(err, errlen, "%s.metadata.%s: must be a string", path, mk);
          return OM_EINVAL;
        }
        in->metadata[k].key = (char *)mk;
        in->metadata[k].value = (char *)json_string_value(mv);
        k++;
      }
      in->n_metadata = k;
    } else {
      om_errbuf(err, errlen,
                "%s.%s: unknown field (id, url, weight, zone, metadata)", path,
                key);
      return OM_EINVAL;
    }
  }
  if (in->id == NULL || in->url == NULL) {
    om_errbuf(err, errlen, "%s.%s: required", path,
              in->id == NULL ? "id" : "url");
    return OM_EINVAL;
  }
  return 0;
}

/* One service entry into a new snapshot. */
static int parse_service(const char *name, json_t *o, om_snapshot_t **out,
                         char *err, size_t errlen) {
  json_t *insts = NULL, *v;
  const char *key;
  uint64_t revision = 1;
  om_instance_t *in = NULL;
  size_t n = 0, bad = 0;
  const char *field = NULL, *why = NULL;
  char path[256];
  int rc;
  if (!om_valid_name(name, strlen(name))) {
    om_errbuf(err, errlen,
              "services.%s: not a valid service name ([A-Za-z0-9._-]{1,128})",
              name);
    return OM_EINVAL;
  }
  if (!json_is_object(o)) {
    om_errbuf(err, errlen, "services.%s: must be an object", name);
    return OM_EINVAL;
  }
  json_object_foreach(o, key, v) {
    if (strcmp(key, "revision") == 0) {
      if (!json_is_integer(v) || json_integer_value(v) < 1) {
        om_errbuf(err, errlen, "services.%s.revision: must be an integer >= 1",
                  name);
        return OM_EINVAL;
      }
      revision = (uint64_t)json_integer_value(v);
    } else if (strcmp(key, "instances") == 0) {
      if (!json_is_array(v)) {
        om_errbuf(err, errlen, "services.%s.instances: must be an array", name);
        return OM_EINVAL;
      }
      insts = v;
    } else {
      om_errbuf(err, errlen,
                "services.%s.%s: unknown field (revision, instances)", name,
                key);
      return OM_EINVAL;
    }
  }
  if (insts == NULL) {
    om_errbuf(err, errlen, "services.%s.instances: required", name);
    return OM_EINVAL;
  }
  n = json_array_size(insts);
  in = calloc(n ? n : 1, sizeof *in);
  if (in == NULL)
    return OM_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    snprintf(path, sizeof path, "services.%s.instances[%zu]", name, i);
    rc = parse_instance(json_array_get(insts, i), path, &in[i], err, errlen);
    if (rc != 0) {
      instances_clear(in, i + 1);
      return rc;
    }
  }
  /* the registry's check, the one URL rule (om_url.h) included: a file
   * the proxy loads is held to what the control plane accepts */
  for (size_t i = 0; i < n; i++) {
    if (om_instance_validate(&in[i], &field, &why) != 0) {
      om_errbuf(err, errlen, "services.%s.instances[%zu].%s: %s", name, i,
                field ? field : "?", why ? why : "invalid");
      instances_clear(in, n);
      return OM_EINVAL;
    }
  }
  rc = om_snapshot_new(name, revision, in, n, out, &bad, &field, &why);
  instances_clear(in, n);
  if (rc == OM_EDUPLICATE)
    om_errbuf(err, errlen, "services.%s.instances[%zu].id: duplicate id", name,
              bad);
  else if (rc == OM_EINVAL)
    om_errbuf(err, errlen, "services.%s.instances[%zu].%s: %s", name, bad,
              field ? field : "?", why ? why : "invalid");
  return rc;
}

int om_proxy_static_parse(const char *buf, size_t len, om_snapshot_t ***out,
                          size_t *n_out, char *err, size_t errlen) {
  json_error_t jerr;
  json_t *root, *services = NULL, *v;
  const char *key;
  om_snapshot_t **snaps = NULL;
  size_t n = 0;
  int rc = 0;
  if (buf == NULL || out == NULL || n_out == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL) {
    /* jansson reports allocation failure as a parse error too */
    om_errbuf(err, errlen, "invalid JSON at line %d, column %d: %s", jerr.line,
              jerr.column, jerr.text);
    return strstr(jerr.text, "out of memory") ? OM_ENOMEM : OM_EPARSE;
  }
  if (!json_is_object(root)) {
    om_errbuf(err, errlen,
              "the document must be an object {\"services\": ...}");
    json_decref(root);
    return OM_EINVAL;
  }
  json_object_foreach(root, key, v) {
    if (strcmp(key, "services") != 0) {
      om_errbuf(err, errlen, "%s: unknown field (services)", key);
      json_decref(root);
      return OM_EINVAL;
    }
    services = v;
  }
  if (!json_is_object(services) || json_object_size(services) == 0) {
    om_errbuf(err, errlen,
              "services: required, an object with at least one "
              "service");
    json_decref(root);
    return OM_EINVAL;
  }
  snaps = calloc(json_object_size(services), sizeof *snaps);
  if (snaps == NULL) {
    json_decref(root);
    return OM_ENOMEM;
  }
  json_object_foreach(services, key, v) {
    rc = parse_service(key, v, &snaps[n], err, errlen);
    if (rc != 0)
      break;
    n++;
  }
  json_decref(root);
  if (rc != 0) {
    if (rc == OM_ENOMEM)
      om_errbuf(err, errlen, "out of memory");
    om_proxy_static_free(snaps, n);
    return rc;
  }
  *out = snaps;
  *n_out = n;
  return 0;
}

int om_proxy_static_load(const char *path, om_snapshot_t ***out, size_t *n,
                         char *err, size_t errlen) {
  FILE *f;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int rc;
  if (path == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  f = fopen(path, "rb");
  if (f == NULL) {
    om_errbuf(err, errlen, "%s: cannot open", path);
    return OM_ENOTFOUND;
  }
  for (;;) {
    size_t k;
    if (len == cap) {
      char *x;
      cap = cap ? 2 * cap : 16384;
      if (cap > ((size_t)64 << 20) || (x = realloc(buf, cap)) == NULL) {
        fclose(f);
        free(buf);
        om_errbuf(err, errlen, "%s: %s", path,
                  cap > ((size_t)64 << 20) ? "larger than 64 MiB"
                                           : "out of memory");
        return cap > ((size_t)64 << 20) ? OM_ETOOBIG : OM_ENOMEM;
      }
      buf = x;
    }
    k = fread(buf + len, 1, cap - len, f);
    len += k;
    if (k == 0)
      break;
  }
  if (ferror(f)) {
    fclose(f);
    free(buf);
    om_errbuf(err, errlen, "%s: cannot read", path);
    return OM_ENOTFOUND;
  }
  fclose(f);
  rc = om_proxy_static_parse(buf, len, out, n, err, errlen);
  free(buf);
  if (rc != 0 && err != NULL && errlen > 0) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", err);
    om_errbuf(err, errlen, "%s: %s", path, tmp);
  }
  return rc;
}
