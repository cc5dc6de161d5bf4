/// Where the gateway is: parsed from the base URL the app gives.
public struct Endpoint: Sendable, Equatable {
    public var secure: Bool
    public var host: String
    public var port: Int
    /// The path the gateway's routes are under: empty, or `/herald` without
    /// a trailing slash.
    public var basePath: String
    /// The request path of the WebSocket route.
    public var webSocketPath: String { basePath + "/v1/ws" }

    /// Accepts `http://`, `https://`, `ws://` and `wss://` base URLs
    /// (`https://herald.example.com`, `http://127.0.0.1:8080/herald`); nil
    /// for anything else.
    public init?(baseURL: String) {
        let schemes: [(String, Bool, Int)] = [("https://", true, 443), ("wss://", true, 443),
                                              ("http://", false, 80), ("ws://", false, 80)]
        guard let (scheme, secure, defaultPort) = schemes.first(where: { baseURL.lowercased().hasPrefix($0.0) })
        else { return nil }
        let rest = baseURL.dropFirst(scheme.count)
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        var base = String(rest.dropFirst(authority.count).prefix { $0 != "?" && $0 != "#" })
        while base.hasSuffix("/") { base.removeLast() }
        var host = String(authority)
        var port = defaultPort
        if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") {
            guard let p = Int(authority[authority.index(after: colon)...]), (1...65535).contains(p) else { return nil }
            port = p
            host = String(authority[..<colon])
        }
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, !host.contains("@") else { return nil }
        self.secure = secure; self.host = host; self.port = port; self.basePath = base
    }
}

/// What a WebSocket connection reports, in order. `.closed` or `.refused`
/// comes once, last.
public enum SocketEvent: Sendable, Equatable {
    case open
    case text(String)
    /// The server answered the upgrade request but did not switch protocols:
    /// `status` is its HTTP status when known (403 from a proxy that refuses
    /// WebSockets, say). Comes instead of `.open`.
    case refused(status: Int?, reason: String)
    /// `code` is the peer's close code, 1000 after our own `close()`, and
    /// 1006 when the connection failed or dropped without a close frame
    /// (`reason` then says why, e.g. a refused certificate).
    case closed(code: Int, reason: String)
}

/// One WebSocket connection, already under way when the transport hands it
/// out. `send` and `close` may be called from any thread.
public protocol WebSocketChannel: Sendable {
    var events: AsyncStream<SocketEvent> { get }
    /// Queues one text message; dropped when the connection is not open.
    func send(_ text: String)
    func close()
}

/// Opens WebSocket connections.
public protocol WebSocketTransport: Sendable {
    func open(_ endpoint: Endpoint) -> any WebSocketChannel
}

public struct HTTPRequest: Sendable {
    public var method: String
    /// Path and query under the endpoint's base path: `/v1/me/sync?cursor=4`.
    public var target: String
    /// Besides `Host` and `Content-Length`, which the transport adds.
    public var headers: [(String, String)]
    public var body: [UInt8]
    /// For connecting and for the whole answer (a held poll included).
    public var timeout: Duration

    public init(method: String, target: String, headers: [(String, String)] = [], body: [UInt8] = [],
                timeout: Duration = .seconds(30)) {
        self.method = method; self.target = target; self.headers = headers; self.body = body; self.timeout = timeout
    }
}

public struct HTTPResponse: Sendable {
    public var status: Int
    public var body: [UInt8]

    public init(status: Int, body: [UInt8]) { self.status = status; self.body = body }
}

/// Sends HTTP requests: one answer per request, redirects not followed.
/// Throws `HeraldClientError.unreachable` when no answer came (refused,
/// dropped, timed out, certificate refused), and `CancellationError` when
/// the calling task is cancelled (the request is abandoned at once).
public protocol HTTPTransport: Sendable {
    func send(_ request: HTTPRequest, to endpoint: Endpoint) async throws -> HTTPResponse
}

/// What the client needs from a platform. Two are shipped: `URLSessionTransport`
/// (HeraldClient; the default on Apple platforms) and `LWSTransport`
/// (HeraldClientLWS, libwebsockets; the default on Linux). Another
/// platform's transport conforms to this alone.
public typealias HeraldTransport = WebSocketTransport & HTTPTransport
