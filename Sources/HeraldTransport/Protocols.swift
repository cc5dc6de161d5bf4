import CLibWebSockets
import Glibc
import HeraldCore
import HeraldGateway

/// The libwebsockets context set-up and the one callback every connection
/// goes through. lws runs the event loop, accepts through Herald's
/// listener, does TLS and reads; every connection is a raw socket whose
/// HTTP and WebSocket protocols Herald speaks itself (HTTPConnection,
/// WebSocketConnection).
enum Protocols {
    nonisolated(unsafe) static let listenName = strdup("herald-listen")!
    nonisolated(unsafe) static let httpName = strdup("herald-http")!
    /// Offered in TLS: HTTP/1.1 only (lws would switch an `h2` connection
    /// to its own HTTP/2 role).
    nonisolated(unsafe) static let alpn = strdup("http/1.1")!

    /// Allocated once: the table must outlive every context.
    nonisolated(unsafe) static let table: UnsafeMutablePointer<lws_protocols> = {
        let p = UnsafeMutablePointer<lws_protocols>.allocate(capacity: 3)
        p.initialize(repeating: lws_protocols(), count: 3)
        // The listener (a raw file). Also told of each vhost's TLS context.
        p[0].name = UnsafePointer(listenName)
        p[0].callback = heraldCallback
        // Connections: one object each in their per-session pointer.
        p[1].name = UnsafePointer(httpName)
        p[1].callback = heraldCallback
        p[1].per_session_data_size = MemoryLayout<UnsafeMutableRawPointer>.size
        p[1].tx_packet_size = ServiceLoop.outputLimit
        return p
    }()

    /// `foreignLoop`: the libev loop this context joins (libev only).
    static func createContext(owner: ServiceLoop, gateway: Gateway, eventLoop: EventLoopKind,
                              foreignLoop: UnsafeMutablePointer<UnsafeMutableRawPointer?>?, tls: TLSFiles?) -> OpaquePointer? {
        var info = lws_context_creation_info()
        // "No listener, but a server" (not CONTEXT_PORT_NO_LISTEN, which
        // would leave the vhost without TLS): Herald listens itself.
        info.port = CONTEXT_PORT_NO_LISTEN_SERVER
        info.protocols = UnsafePointer(table)
        info.gid = -1
        info.uid = -1
        info.user = Unmanaged.passUnretained(owner).toOpaque()
        // The TLS handshake's deadline.
        info.timeout_secs = UInt32(gateway.config.limits.requestTimeoutSeconds)
        info.count_threads = 1
        if eventLoop == .libev {
            // A loop of our own ("foreign"): lws then installs no SIGINT
            // watcher per loop (libev allows one loop per signal).
            info.options |= UInt64(LWS_SERVER_OPTION_LIBEV)
            info.foreign_loops = foreignLoop
        }
        guard let tls else { return lws_create_context(&info) }
        info.options |= UInt64(LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT)
        info.alpn = UnsafePointer(alpn)
        return tls.certificate.withCString { cert in
            tls.key.withCString { key in
                info.ssl_cert_filepath = cert
                info.ssl_private_key_filepath = key
                return lws_create_context(&info)
            }
        }
    }

    /// Puts `o` in place of the object a connection carries.
    static func replaceAttached(_ wsi: OpaquePointer, with o: AnyObject) {
        let pss = lws_wsi_user(wsi)
        _ = detach(pss)
        attach(pss, o)
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
private func attached(_ pss: UnsafeMutableRawPointer?) -> RawConnection? {
    guard let raw = pss?.load(as: UnsafeMutableRawPointer?.self) else { return nil }
    return Unmanaged<AnyObject>.fromOpaque(raw).takeUnretainedValue() as? RawConnection
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

    case LWS_CALLBACK_OPENSSL_LOAD_EXTRA_SERVER_VERIFY_CERTS:
        // The vhost's TLS context, made with the certificate: kept for reloads.
        let ctx = OpaquePointer(user)
        herald_tls_prepare(ctx)
        loopOf(wsi).tlsContext = ctx
        return 0

    case LWS_CALLBACK_RAW_ADOPT:
        let loop = loopOf(wsi)
        attach(user, loop.adopt(LWSSocket(wsi!, loop: loop)))
        return 0

    case LWS_CALLBACK_RAW_RX:
        attached(user)?.receive(UnsafeRawBufferPointer(start: input, count: len))
        return 0

    case LWS_CALLBACK_RAW_WRITEABLE:
        return attached(user)?.writable() ?? 0

    case LWS_CALLBACK_RAW_CLOSE:
        if let c = detach(user) as? RawConnection { loopOf(wsi).closed(c) }
        return 0

    default:
        return lws_callback_http_dummy(wsi, reason, user, input, len)
    }
}
