import CLibWebSockets
import Foundation
import HeraldCore
import HeraldGateway
import Synchronization

/// The libwebsockets this binary runs on, as it reports itself.
public var libwebsocketsVersion: String { String(cString: lws_get_library_version()) }

/// A certificate chain and its private key, PEM files.
public struct TLSFiles: Sendable {
    public let certificate: String
    public let key: String
    public init(certificate: String, key: String) { self.certificate = certificate; self.key = key }

    /// Whether the files make a usable pair; if not, OpenSSL's reason.
    public func validate() throws(ServerError) { SSL_CTX_free(try load()) }

    /// Loads both into a fresh TLS context: the files' own error if they do
    /// not make a usable pair.
    func load() throws(ServerError) -> OpaquePointer {
        let ctx = SSL_CTX_new(TLS_server_method())!
        var error = [CChar](repeating: 0, count: 256)
        guard herald_tls_load(ctx, certificate, key, &error, error.count) == 0 else {
            SSL_CTX_free(ctx)
            throw ServerError("cannot use TLS certificate \(certificate) with key \(key): \(error.withUnsafeBufferPointer { String(cString: $0.baseAddress!) })")
        }
        return ctx
    }
}

/// How many connections the process has open, against its cap. Shared by
/// the loops: counted at adoption and release on loop threads.
final class Admission: Sendable {
    let cap: Int
    private let open = Atomic<Int>(0)

    init(cap: Int) { self.cap = cap }

    /// Counts a new connection; false when it is past the cap (it is to be
    /// answered 503, and is counted until it closes all the same).
    func admit() -> Bool { open.add(1, ordering: .relaxed).newValue <= cap }
    func release() { open.subtract(1, ordering: .relaxed) }
}

/// A bound, listening TCP socket: the gateway's own, or one a worker of
/// `herald serve --workers N` was handed by its supervisor, which bound it
/// (Supervisor.swift). No SO_REUSEPORT either way (shim.h, herald_listen).
public struct ListeningSocket: Sendable {
    public let fd: Int32
    public let port: Int

    /// Binds and listens (port 0: a free one). A port in use throws `addressInUse`.
    public init(host: String, port: Int) throws(ServerError) {
        var bound: Int32 = 0
        let fd = herald_listen(host, Int32(port), &bound)
        guard fd >= 0 else {
            throw ServerError("cannot listen on \(host):\(port): \(String(cString: strerror(-fd)))", addressInUse: -fd == EADDRINUSE)
        }
        self.fd = fd
        self.port = Int(bound)
    }

    /// A descriptor inherited across exec: checked to be an IPv4 socket
    /// that listens, and made close-on-exec again.
    public init(inherited fd: Int32) throws(ServerError) {
        let port = herald_listening_port(fd)
        guard port >= 0 else { throw ServerError("descriptor \(fd) is not a listening IPv4 socket") }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        self.fd = fd
        self.port = Int(port)
    }
}

/// Serves a gateway on `threads` libwebsockets loops sharing one port.
public final class Server {
    let gateway: Gateway
    private var loops: [ServiceLoop] = []
    public private(set) var port: Int
    let host: String
    let threads: Int
    let eventLoop: EventLoopKind
    let tls: TLSFiles?
    let admission: Admission
    /// A listening socket bound already (a worker's, bound by its
    /// supervisor), or nil: `start` binds one itself.
    private let given: ListeningSocket?

    public init(gateway: Gateway, host: String, port: Int, threads: Int, eventLoop: EventLoopKind = .default, tls: TLSFiles? = nil,
                listening: ListeningSocket? = nil) {
        self.gateway = gateway
        given = listening
        self.port = port
        self.host = host
        self.threads = max(1, threads)
        self.eventLoop = eventLoop
        self.tls = tls
        let limit = gateway.config.limits.maxConnections
        admission = Admission(cap: limit > 0 ? limit : Self.connectionCap(descriptors: Self.descriptorLimit()))
        lws_set_log_level(ProcessInfo.processInfo.environment["HERALD_LWS_LOG"].flatMap { Int32($0) } ?? (LLL_ERR | LLL_WARN), nil)
    }

    /// The process's open-file limit (soft).
    static func descriptorLimit() -> Int {
        var r = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &r)
        return Int(clamping: min(r.rlim_cur, rlim_t(Int32.max)))
    }

    /// Connections one process may hold with `descriptors` open files: the
    /// rest (5 %, at least 64) stays for the store, the loops, logs and the
    /// connections being refused.
    static func connectionCap(descriptors: Int) -> Int {
        max(1, descriptors - max(64, descriptors / 20))
    }

    /// Binds the port (resolving port 0) unless given a socket, then starts the engine and every
    /// loop, each watching its own duplicate of the listening socket (so
    /// each closes its own at shutdown). A port in use throws `addressInUse`.
    public func start() throws {
        let socket = try given ?? ListeningSocket(host: host, port: port)
        let fd = socket.fd
        port = socket.port
        defer { close(fd) }
        loops = (0..<threads).map {
            ServiceLoop(index: $0, listenFd: dup(fd), gateway: gateway, admission: admission, eventLoop: eventLoop, tls: tls)
        }
        let shards = gateway.makeShards(loops)
        for (l, s) in zip(loops, shards) { l.shard = s }
        gateway.start()
        for l in loops { try l.start() }
    }

    public var servesTLS: Bool { tls != nil }

    /// Reads the certificate and key again (SIGHUP) and gives them to every
    /// loop, on its thread: new TLS sessions use them, open ones keep
    /// theirs. Files that do not load change nothing.
    public func reloadTLS() throws(ServerError) {
        guard let tls else { return }
        let fresh = try tls.load()
        let source = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(fresh)))
        let done = DispatchSemaphore(value: 0)
        let failed = Atomic<Int>(0)
        for l in loops {
            l.post {
                if let ctx = l.tlsContext, herald_tls_copy(ctx, OpaquePointer(bitPattern: source)) == 0 {} else {
                    failed.add(1, ordering: .relaxed)
                }
                done.signal()
            }
        }
        for _ in loops { done.wait() }
        SSL_CTX_free(fresh)
        if failed.load(ordering: .relaxed) > 0 { throw ServerError("a service loop could not take the new TLS certificate") }
    }

    /// SPEC section 6: stop accepting, answer held polls, end event streams,
    /// close WebSockets with 1001, flush the store, all within 10 s.
    /// No wait here is open-ended: a loop that does not answer counts as
    /// busy, and one that does not stop is left to the process exit.
    public func shutdown(deadline seconds: Double = 8) {
        for l in loops { l.post { l.beginShutdown() } }
        let drained = DispatchTime.now() + seconds / 2
        while DispatchTime.now() < drained {
            let open = loops.reduce(0) { sum, l in
                let box = OpenCount()
                let done = DispatchSemaphore(value: 0)
                l.post { box.value.store(l.openConnections, ordering: .relaxed); done.signal() }
                return sum + (done.wait(timeout: drained) == .success ? box.value.load(ordering: .relaxed) : 1)
            }
            if open == 0 { break }
            Thread.sleep(forTimeInterval: 0.02)
        }
        gateway.stop()
        let stopped = DispatchTime.now() + seconds / 2
        for l in loops { l.stop(until: stopped) }
    }
}

private final class OpenCount: Sendable { let value = Atomic<Int>(0) }
