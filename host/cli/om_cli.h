/* om_cli.h: what every `openmesh` subcommand shares. */
#ifndef OM_CLI_H
#define OM_CLI_H

enum { OM_EXIT_OK = 0, OM_EXIT_FAILURE = 1, OM_EXIT_USAGE = 2 };

typedef struct om_cli_command_s {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv); /* argv[0] is the command name */
} om_cli_command_t;

#endif /* OM_CLI_H */
