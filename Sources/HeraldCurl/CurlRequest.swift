import Foundation

/// One HTTP request to a push service.
public struct CurlRequest: Sendable {
    /// An HTTP method token, such as "POST".
    public var method: String
    /// Only `https` URLs are sent.
    public var url: String
    /// Sent in this order. A name or value holding CR, LF or NUL refuses the request.
    public var headers: [(String, String)]
    public var body: [UInt8]
    /// The whole request, from `send` (waiting for room included) to the
    /// answer's last byte; with `startWithin`, from its start on the wire.
    public var timeout: Duration
    /// When set, the longest the request may wait for room on the wire:
    /// past it, it fails `notStarted`, never sent.
    public var startWithin: Duration?

    public init(method: String, url: String, headers: [(String, String)], body: [UInt8], timeout: Duration,
                startWithin: Duration? = nil) {
        self.method = method; self.url = url; self.headers = headers; self.body = body; self.timeout = timeout
        self.startWithin = startWithin
    }
}

/// What a server answered, whatever the status.
public struct CurlResponse: Sendable {
    public let status: Int
    /// Lower-cased names; of a repeated header, the last.
    public let headers: [String: String]
    public let body: [UInt8]
    /// 2 when the answer came over HTTP/2, else 1.
    public let httpVersion: Int

    public init(status: Int, headers: [String: String], body: [UInt8], httpVersion: Int) {
        self.status = status; self.headers = headers; self.body = body; self.httpVersion = httpVersion
    }
}

extension CurlResponse {
    /// `Retry-After` in seconds (the delta form; a date is taken as none).
    public var retryAfterSeconds: Int? { headers["retry-after"].flatMap { Int($0.trimmingCharacters(in: .whitespaces)) } }
}

extension CurlRequest {
    /// Why the request must not be sent, if it must not: a URL that is not
    /// `https` (nor `http` when `plainHTTP`), a method that is not a token,
    /// a header that could smuggle in others.
    public func refusal(plainHTTP: Bool) -> String? {
        // On bytes, not Characters: this runs for every request.
        func scheme(_ s: String) -> Bool { url.utf8.starts(with: s.utf8) { $0 == $1 || (0x41...0x5A).contains($0) && $0 + 0x20 == $1 } }
        guard scheme("https://") || (plainHTTP && scheme("http://")) else {
            return "only https URLs are sent to"
        }
        guard !method.isEmpty, method.utf8.allSatisfy({ (0x41...0x5A).contains($0 & ~0x20) }) else {
            return "method \(method.debugDescription)"
        }
        // A line break in a header would let its value smuggle in other headers.
        for (name, value) in headers where name.isEmpty || name.utf8.contains(where: { $0 <= 0x20 || $0 == UInt8(ascii: ":") })
            || value.utf8.contains(where: { $0 == 0 || $0 == 0x0A || $0 == 0x0D }) {
            return "header \(name.debugDescription)"
        }
        return nil
    }
}
