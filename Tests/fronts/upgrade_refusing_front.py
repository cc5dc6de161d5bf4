#!/usr/bin/env python3
"""A reverse proxy in front of a gateway that answers WebSocket upgrades with
403 while told to, as some corporate proxies do, and passes everything else
through. Used by HeraldClient's fallback test.

    upgrade_refusing_front.py UPSTREAM_PORT

Prints `listening on PORT` once it accepts connections. Reads `allow` or
`refuse` lines on stdin (refusing at start) and answers each with `ok`.
"""
import asyncio
import sys

refusing = True


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def serve(upstream_port, client_reader, client_writer):
    try:
        head = await client_reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        client_writer.close()
        return
    if refusing and b"\nupgrade: websocket" in head.lower():
        body = b"upgrades are not allowed here\n"
        client_writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: "
                            + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        await client_writer.drain()
        client_writer.close()
        return
    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
    up_writer.write(head)
    await asyncio.gather(pipe(client_reader, up_writer), pipe(up_reader, client_writer))


async def control():
    global refusing
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        refusing = line.strip() != "allow"
        print("ok", flush=True)


async def main():
    upstream_port = int(sys.argv[1])
    server = await asyncio.start_server(lambda r, w: serve(upstream_port, r, w), "127.0.0.1", 0)
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    await control()  # ends with stdin: the test is gone


asyncio.run(main())
