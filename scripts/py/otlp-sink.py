"""A stand-in OTLP/HTTP collector for benchmarks (stdlib only): answers every
`POST /v1/traces` with 200 and an empty body (an empty ExportTraceServiceResponse),
counting requests and bytes; prints the counts on exit (SIGTERM/SIGINT).

    python3 scripts/py/otlp-sink.py PORT
"""

import http.server
import signal
import sys

count = {"posts": 0, "bytes": 0}


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        count["posts"] += 1
        count["bytes"] += n
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink)

    def stop(*_):
        print(f"otlp-sink: {count['posts']} exports, {count['bytes']} bytes", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    srv.serve_forever()


if __name__ == "__main__":
    main()
