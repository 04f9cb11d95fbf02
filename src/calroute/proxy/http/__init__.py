"""The proxy's HTTP/1.1 transport on httptools: server, engine client, framing, SSE scan, polls."""
