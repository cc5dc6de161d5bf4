/// Where the gateway's WebSocket is: parsed from the base URL the app gives.
public struct Endpoint: Sendable, Equatable {
    public var secure: Bool
    public var host: String
    public var port: Int
    /// The request path of the WebSocket route (`/v1/ws` under the base path).
    public var path: String

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
        self.secure = secure; self.host = host; self.port = port; self.path = base + "/v1/ws"
    }
}

/// What a WebSocket connection reports, in order. `.closed` comes once, last.
public enum SocketEvent: Sendable, Equatable {
    case open
    case text(String)
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

/// Opens WebSocket connections. `LWSTransport` is the one shipped (Linux,
/// libwebsockets); another platform's transport conforms to this alone.
public protocol WebSocketTransport: Sendable {
    func open(_ endpoint: Endpoint) -> any WebSocketChannel
}
