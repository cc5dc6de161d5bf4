import CLibWebSockets
import Glibc
import HeraldCore
import HeraldGateway

/// The libwebsockets context set-up and the one callback every connection
/// goes through.
enum Protocols {
    nonisolated(unsafe) static let name = strdup("herald")!
    nonisolated(unsafe) static let listenName = strdup("herald-listen")!
    nonisolated(unsafe) static let httpName = strdup("herald-http")!

    /// Protocol table and idle policy: allocated once, they must outlive
    /// every context.
    nonisolated(unsafe) static let table: UnsafeMutablePointer<lws_protocols> = {
        let p = UnsafeMutablePointer<lws_protocols>.allocate(capacity: 4)
        p.initialize(repeating: lws_protocols(), count: 4)
        // WebSockets: lws's HTTP server takes the upgrade, then frames.
        p[0].name = UnsafePointer(name)
        p[0].callback = heraldCallback
        p[0].per_session_data_size = MemoryLayout<UnsafeMutableRawPointer>.size
        // lws keeps a receive buffer of this size per WebSocket, and its first
        // page is always touched: 512 bytes holds a hello or an update, and
        // larger messages arrive in pieces that WebSocketConnection joins.
        // (65536 cost 7.7 KB of RSS per idle connection; 512 costs 4.05 KB.)
        p[0].rx_buffer_size = 512
        // Without this lws sends at most rx_buffer_size bytes per writable
        // event: a 100 KB answer would take 200 round trips through epoll.
        p[0].tx_packet_size = ServiceLoop.outputLimit
        // The listener and the set of sockets not yet sorted (raw files).
        p[1].name = UnsafePointer(listenName)
        p[1].callback = heraldCallback
        // Plain HTTP, read and written by HTTPConnection (raw sockets).
        p[2].name = UnsafePointer(httpName)
        p[2].callback = heraldCallback
        p[2].per_session_data_size = MemoryLayout<UnsafeMutableRawPointer>.size
        p[2].tx_packet_size = ServiceLoop.outputLimit
        return p
    }()

    nonisolated(unsafe) static var retry = lws_retry_bo_t()

    /// Whether lws bound `wsi` to Herald's WebSocket protocol (by name: lws
    /// keeps its own copy of the table per vhost).
    static func isWebSocket(_ wsi: OpaquePointer?) -> Bool {
        guard let p = lws_get_protocol(wsi), let n = p.pointee.name else { return false }
        return strcmp(n, name) == 0
    }

    /// `foreignLoop`: the libev loop this context joins (libev only).
    static func createContext(owner: ServiceLoop, gateway: Gateway, eventLoop: EventLoopKind,
                              foreignLoop: UnsafeMutablePointer<UnsafeMutableRawPointer?>?) -> OpaquePointer? {
        retry.secs_since_valid_ping = UInt16(gateway.config.limits.pingIntervalSeconds)
        retry.secs_since_valid_hangup = UInt16(gateway.config.limits.idleHangupSeconds)
        var info = lws_context_creation_info()
        info.port = CONTEXT_PORT_NO_LISTEN_SERVER
        info.protocols = UnsafePointer(table)
        info.gid = -1
        info.uid = -1
        info.user = Unmanaged.passUnretained(owner).toOpaque()
        info.max_http_header_data = 8192
        info.timeout_secs = 20
        info.count_threads = 1
        if eventLoop == .libev {
            // A loop of our own ("foreign"): lws then installs no SIGINT
            // watcher per loop (libev allows one loop per signal).
            info.options |= UInt64(LWS_SERVER_OPTION_LIBEV)
            info.foreign_loops = foreignLoop
        }
        withUnsafePointer(to: &retry) { info.retry_and_idle_policy = $0 }
        return lws_create_context(&info)
    }
}

/// The loop under each context. `poll()` costs O(connections) per wake-up;
/// libev (the lws plugin from Debian's libwebsockets-evlib-ev) uses epoll.
/// (libuv was tried: with lws 4.1.6 its connections closed without sending
/// the WebSocket close frame.)
public enum EventLoopKind: String, Sendable, CaseIterable {
    case poll, libev
    public static let `default` = EventLoopKind.libev
}

private func loopOf(_ wsi: OpaquePointer?) -> ServiceLoop {
    Unmanaged<ServiceLoop>.fromOpaque(lws_context_user(lws_get_context(wsi))).takeUnretainedValue()
}

/// The object kept in a connection's per-session pointer.
private func attached<T: AnyObject>(_ pss: UnsafeMutableRawPointer?, _: T.Type) -> T? {
    guard let raw = pss?.load(as: UnsafeMutableRawPointer?.self) else { return nil }
    return Unmanaged<AnyObject>.fromOpaque(raw).takeUnretainedValue() as? T
}

private func attach(_ pss: UnsafeMutableRawPointer?, _ o: AnyObject) {
    pss?.storeBytes(of: Unmanaged.passRetained(o).toOpaque(), as: UnsafeMutableRawPointer?.self)
}

private func detach(_ pss: UnsafeMutableRawPointer?) -> AnyObject? {
    guard let pss, let raw = pss.load(as: UnsafeMutableRawPointer?.self) else { return nil }
    pss.storeBytes(of: nil, as: UnsafeMutableRawPointer?.self)
    return Unmanaged<AnyObject>.fromOpaque(raw).takeRetainedValue()
}

func heraldCallback(wsi: OpaquePointer?, reason: lws_callback_reasons, user: UnsafeMutableRawPointer?,
                    input: UnsafeMutableRawPointer?, len: Int) -> Int32 {
    switch reason {
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        loopOf(wsi).drainInbox()
        return 0

    case LWS_CALLBACK_RAW_RX_FILE:
        loopOf(wsi).readable(lws_get_socket_fd(wsi))
        return 0

    case LWS_CALLBACK_HTTP:
        // Only `GET /v1/ws` reaches lws's HTTP server (ServiceLoop.sort);
        // without an upgrade it is refused like on any other connection.
        let r = HTTPResponse.error(Gateway.upgradeExpected)
        let out = HTTPWire.responseHead(r, length: r.body.count, close: true) + r.body
        // A fresh connection's socket buffer takes it whole.
        _ = send(lws_get_socket_fd(wsi), out, out.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
        return -1

    case LWS_CALLBACK_RAW_ADOPT:
        let loop = loopOf(wsi)
        let c = HTTPConnection(wsi: wsi!, loop: loop)
        attach(user, c)
        loop.httpConnections[ObjectIdentifier(c)] = c
        return 0

    case LWS_CALLBACK_RAW_RX:
        attached(user, HTTPConnection.self)?.receive(UnsafeRawBufferPointer(start: input, count: len))
        return 0

    case LWS_CALLBACK_RAW_WRITEABLE:
        return attached(user, HTTPConnection.self)?.writable() ?? 0

    case LWS_CALLBACK_RAW_CLOSE:
        if let c = detach(user) as? HTTPConnection {
            c.closed()
            loopOf(wsi).httpConnections[ObjectIdentifier(c)] = nil
        }
        return 0

    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
        // lws binds an upgrade to whichever protocol its Sec-WebSocket-Protocol
        // names: refuse the listener's and raw HTTP's, which keep no state per
        // connection (the connection object would outlive its wsi).
        return Protocols.isWebSocket(wsi) ? 0 : 1

    case LWS_CALLBACK_ESTABLISHED:
        guard user != nil, Protocols.isWebSocket(wsi) else { return -1 }
        let loop = loopOf(wsi)
        let c = WebSocketConnection(wsi: wsi!, loop: loop)
        attach(user, c)
        loop.webSockets[ObjectIdentifier(c)] = c
        return 0

    case LWS_CALLBACK_RECEIVE:
        guard let c = attached(user, WebSocketConnection.self) else { return -1 }
        c.receive(input.map { UnsafeRawBufferPointer(start: $0, count: len) } ?? UnsafeRawBufferPointer(start: nil, count: 0))
        return 0

    case LWS_CALLBACK_SERVER_WRITEABLE:
        return attached(user, WebSocketConnection.self)?.writable() ?? 0

    case LWS_CALLBACK_CLOSED:
        if let c = detach(user) as? WebSocketConnection {
            c.closed()
            loopOf(wsi).webSockets[ObjectIdentifier(c)] = nil
        }
        return 0

    default:
        return lws_callback_http_dummy(wsi, reason, user, input, len)
    }
}
