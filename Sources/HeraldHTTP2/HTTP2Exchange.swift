import HeraldCurl

/// Where a request goes: one connection each.
struct Origin: Hashable {
    /// As the URL has it, brackets of an IPv6 literal dropped.
    let host: String
    let port: UInt16
    /// `:authority`: host and port as the URL gave them.
    let authority: String
}

/// One request taken from the client's queue, until it completes: what it
/// asks and what has come back so far. On the loop thread only.
final class HTTP2Exchange {
    let request: CurlRequest
    let completion: CurlClient.Completion
    let origin: Origin
    /// `:path`, the query included.
    let path: String
    /// By when the whole answer must be in.
    let deadline: ContinuousClock.Instant

    var status = 0
    var headers: [String: String] = [:]
    var body: [UInt8] = []
    /// Bytes of the request's body handed to nghttp2 so far.
    var sent = 0
    /// Bytes of header names and values taken.
    var headerBytes = 0
    /// Set when the answer cannot be taken (too large): the stream is reset and this is the result.
    var failure: CurlFailure?

    init(_ request: CurlRequest, completion: @escaping CurlClient.Completion, origin: Origin, path: String,
         deadline: ContinuousClock.Instant) {
        self.request = request; self.completion = completion; self.origin = origin; self.path = path; self.deadline = deadline
    }

    /// Forgets what came back, for sending again on another connection.
    func restart() {
        status = 0; headers = [:]; body = []; sent = 0; headerBytes = 0; failure = nil
    }

    var response: CurlResponse { CurlResponse(status: status, headers: headers, body: body, httpVersion: 2) }

    /// The origin and `:path` of an `https` URL (`refusal` has checked the
    /// scheme), or why it cannot be sent.
    static func target(_ url: String) -> Result<(Origin, String), CurlFailure> {
        let rest = url.utf8.dropFirst("https://".utf8.count)
        let end = rest.firstIndex { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") } ?? rest.endIndex
        let authority = String(decoding: rest[..<end], as: UTF8.self)
        var path = String(decoding: rest[end...].prefix { $0 != UInt8(ascii: "#") }, as: UTF8.self)
        if path.isEmpty || path.hasPrefix("?") { path = "/" + path }
        // No user information: it would be sent nowhere, and a URL holding it is likely a trick.
        guard !authority.isEmpty, !authority.contains("@") else { return .failure(.refused("URL \(url.debugDescription)")) }
        var host = Substring(authority), port: UInt16 = 443
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return .failure(.refused("URL \(url.debugDescription)")) }
            let after = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if !after.isEmpty {
                guard after.hasPrefix(":"), let p = UInt16(after.dropFirst()) else { return .failure(.refused("URL \(url.debugDescription)")) }
                port = p
            }
        } else if let colon = host.lastIndex(of: ":") {
            guard let p = UInt16(host[host.index(after: colon)...]) else { return .failure(.refused("URL \(url.debugDescription)")) }
            port = p
            host = host[..<colon]
        }
        guard !host.isEmpty else { return .failure(.refused("URL \(url.debugDescription)")) }
        return .success((Origin(host: String(host), port: port, authority: authority), path))
    }
}
