// Preloaded into the Portkey gateway (node --import) by
// bench/egress_gateway_bench.sh: its start-server listens on every
// interface (server.listen(port), no host argument) and has no flag for a
// host, so a bench on a shared machine binds it to 127.0.0.1 here. Only a
// listen() given a bare port is changed; everything else runs as shipped.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" && typeof args[1] !== "string")
    args.splice(1, 0, "127.0.0.1");
  else if (args[0] && typeof args[0] === "object" && args[0].port !== undefined && !args[0].host)
    args[0] = { ...args[0], host: "127.0.0.1" };
  return listen.apply(this, args);
};
