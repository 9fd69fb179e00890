#!/usr/bin/python3
"""hello.py PORT NAME: the service of the HA example, an HTTP/1.1 server
on 127.0.0.1:PORT that answers every GET with "hello from NAME"."""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = ("hello from %s\n" % sys.argv[2]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Hello).serve_forever()
