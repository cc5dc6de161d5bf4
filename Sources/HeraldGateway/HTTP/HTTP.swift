import HeraldCore

/// A parsed HTTP request, as the transport hands it over.
public struct HTTPRequest: Sendable {
    public var method: String
    /// The path as sent, without the query: still percent-encoded, so an
    /// encoded `/` stays inside its segment (see `Route.match`).
    public var path: String
    /// Decoded query parameters in order.
    public var query: [(String, String)]
    /// Lower-cased names; only the headers the API reads.
    public var headers: [String: String]
    public var body: [UInt8]

    public init(method: String, path: String, query: [(String, String)] = [], headers: [String: String] = [:], body: [UInt8] = []) {
        self.method = method; self.path = path; self.query = query; self.headers = headers; self.body = body
    }

    /// The header names the transport must copy into `headers`.
    public static let headerNames = ["authorization", "herald-device", "if-match", "last-event-id", "content-type",
                                     "upgrade", "sec-websocket-key", "sec-websocket-version",
                                     "origin", "access-control-request-method"]

    public func queryValue(_ name: String) -> String? { query.first { $0.0 == name }?.1 }
}

public struct HTTPResponse: Sendable {
    public var status: Int
    public var contentType: String
    public var headers: [(String, String)]
    public var body: [UInt8]

    public init(status: Int, contentType: String = "application/json", headers: [(String, String)] = [], body: [UInt8]) {
        self.status = status; self.contentType = contentType; self.headers = headers; self.body = body
    }

    public static func json(_ status: Int, _ j: JSON) -> HTTPResponse {
        HTTPResponse(status: status, body: j.encoded)
    }

    public static func error(_ e: HeraldError) -> HTTPResponse {
        var r = json(e.code.httpStatus, e.json)
        if e.code == .rateLimited || e.retryAfterSeconds != nil {
            r.headers.append(("Retry-After", String(max(1, e.retryAfterSeconds ?? 1))))
        }
        if let allowed = e.allowedMethods { r.headers.append(("Allow", allowed.joined(separator: ", "))) }
        if e.code == .unauthorized { r.headers.append(("WWW-Authenticate", "Bearer")) }
        return r
    }

    public static let noContent = HTTPResponse(status: 204, body: [])
}

/// Answers one HTTP request. Called on the request's shard thread only;
/// answering a request whose connection has gone does nothing.
public protocol HTTPResponder: AnyObject, Sendable {
    func respond(_ r: HTTPResponse)
    /// Starts an answer of unknown length (Server-Sent Events).
    func startStream(contentType: String, headers: [(String, String)])
    /// Appends to a started stream.
    func send(_ bytes: [UInt8])
    /// Ends a stream once what is queued is written (closing the connection).
    func finish()
    /// Bytes queued for a stream and not yet written.
    var queuedBytes: Int { get }
    /// `f` runs on the shard thread if the connection closes before the
    /// answer is complete.
    func onClose(_ f: @escaping () -> Void)
    /// Runs `f` once, on the shard thread, as soon as fewer than `bytes`
    /// of a started stream are queued unwritten (at once if that is so now).
    /// Not called if the connection closes (or the stream is finished) first.
    func whenDrained(below bytes: Int, _ f: @escaping () -> Void)
}
