/* om_cmds.h: the `openmesh` subcommands, one function each. */
#ifndef OM_CMDS_H
#define OM_CMDS_H

int om_cmd_check(int argc, char **argv);
int om_cmd_control(int argc, char **argv);
int om_cmd_egress(int argc, char **argv);
int om_cmd_proxy(int argc, char **argv);
int om_cmd_test(int argc, char **argv);
int om_cmd_up(int argc, char **argv);
int om_cmd_register(int argc, char **argv);
int om_cmd_replay(int argc, char **argv);

#endif /* OM_CMDS_H */
