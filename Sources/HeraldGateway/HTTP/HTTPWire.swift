import HeraldCore

/// HTTP/1.1 framing (RFC 9112) for a transport that reads and writes the
/// bytes itself: request heads in, response heads and chunks out. No I/O.
public enum HTTPWire {
    /// The longest request head (request line and header fields) taken.
    public static let maxHead = 8192

    /// A request head: the request without its body, the body's length and
    /// whether the connection may carry another request after the answer.
    public struct Head: Sendable {
        public var request: HTTPRequest
        public var bodyLength: Int
        public var keepAlive: Bool
        /// `Connection: upgrade` was sent (a WebSocket handshake, with `Upgrade`).
        public var connectionUpgrade = false
        /// An HTTP/1.0 request: such a client knows no chunked bodies, so a
        /// stream goes to it raw, ended by closing the connection.
        public var http10 = false
        /// `Expect: 100-continue`: the client waits for a `100 Continue`
        /// before it sends its body (libcurl's default above 1 KiB: else
        /// each such publish waited a second).
        public var expectsContinue = false
        /// A well-framed request the gateway must not see (a malformed
        /// query): answered with this, the connection kept.
        public var refusal: HeraldError?
    }

    public enum Parsed: Sendable {
        case incomplete
        /// A head, and how many bytes it took.
        case head(Head, size: Int)
        /// Not a request this server takes. Answer it and close: where the
        /// next request would start is unknown.
        case malformed(HeraldError)
    }

    /// Bytes of empty lines (CR and LF) taken before a request line. RFC
    /// 9112 2.2 asks to ignore at least one empty line there; a client
    /// sending more is not sending HTTP. They count toward `maxHead`.
    public static let maxPreamble = 8

    public static func parseHead(_ bytes: ArraySlice<UInt8>) -> Parsed {
        var scanned = 0
        return parseHead(bytes, scanned: &scanned)
    }

    /// `parseHead` for a head that arrives in pieces: `scanned` (0 for a
    /// new head) is how far from `bytes.startIndex` earlier calls looked
    /// for the head's end; this call looks on from there and moves it on,
    /// so each byte is looked at a bounded number of times however the
    /// head is cut. The answer is the same as `parseHead`'s.
    public static func parseHead(_ bytes: ArraySlice<UInt8>, scanned: inout Int) -> Parsed {
        let base = bytes.startIndex
        // RFC 9112 2.2: empty lines before a request line are ignored (a
        // few of them); LF alone ends a line as well as CRLF.
        var start = base
        while start < bytes.endIndex, bytes[start] == cr || bytes[start] == lf {
            guard start - base < maxPreamble else { return .malformed(.badRequest("too many empty lines before the request line")) }
            start += 1
        }
        // The head ends with its first empty line. `start` is neither CR nor
        // LF, so an LF ends an empty line exactly when LF or LF CR precedes it.
        let limit = min(bytes.endIndex, base + maxHead)
        var i = max(start, base + scanned)
        var end: Int?
        while i < limit {
            if bytes[i] == lf, i > start, bytes[i - 1] == lf || (bytes[i - 1] == cr && i - 2 >= start && bytes[i - 2] == lf) {
                end = i + 1
                break
            }
            i += 1
        }
        guard let end else {
            scanned = limit - base
            return bytes.endIndex - base < maxHead ? .incomplete : .malformed(HeraldError(.tooLarge, "request head larger than \(maxHead) bytes"))
        }
        scanned = end - base
        var lines: [ArraySlice<UInt8>] = []
        var lineStart = start
        for i in start..<end where bytes[i] == lf {
            let line = bytes[lineStart..<i].last == cr ? bytes[lineStart..<i - 1] : bytes[lineStart..<i]
            lineStart = i + 1
            if line.isEmpty { break }
            lines.append(line)
        }
        switch head(lines) {
        case .success(let h): return .head(h, size: end - base)
        case .failure(let e): return .malformed(e)
        }
    }

    private static func head(_ lines: [ArraySlice<UInt8>]) -> Result<Head, HeraldError> {
        let parts = lines[0].split(separator: space, omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, parts[0].allSatisfy(isTokenChar),
              !parts[1].isEmpty, parts[1].allSatisfy({ $0 > space && $0 < 0x7F })
        else { return .failure(.badRequest("malformed request line")) }
        let http10 = parts[2].elementsEqual("HTTP/1.0".utf8)
        guard http10 || parts[2].elementsEqual("HTTP/1.1".utf8) else { return .failure(.badRequest("HTTP/1.1 or HTTP/1.0 only")) }
        // Split as bytes: a String's `firstIndex(of:)` walks Characters,
        // 14,000 instructions a request (callgrind).
        let target = parts[1]
        let mark = target.firstIndex(of: UInt8(ascii: "?"))
        let path = String(decoding: target[..<(mark ?? target.endIndex)], as: UTF8.self)
        let query = mark.map { String(decoding: target[($0 + 1)...], as: UTF8.self) } ?? ""
        var request = HTTPRequest(method: String(decoding: parts[0], as: UTF8.self), path: path)
        request.headers.reserveCapacity(4)
        var length: Int?
        var connection: [Substring] = []
        var expectsContinue = false
        var hosts = 0, hostValid = true
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")), colon > line.startIndex,
                  line[..<colon].allSatisfy(isTokenChar)
            else { return .failure(.badRequest("malformed header field")) }
            var v = line[(colon + 1)...]
            // RFC 9112 2.2 and RFC 9110 5.5: a bare CR or a NUL in a field
            // value is rejected (or replaced; Herald rejects).
            guard !v.contains(where: { $0 == cr || $0 == 0 }) else { return .failure(.badRequest("bare CR or NUL in a header field")) }
            // Most of a request's fields are not read: their names are
            // matched as bytes, and no String is made for them.
            guard let field = Field.named(line[..<colon]) else { continue }
            while let c = v.first, c == space || c == tab { v = v.dropFirst() }
            while let c = v.last, c == space || c == tab { v = v.dropLast() }
            // Made only for the fields that keep or compare it as text.
            var value: String { String(decoding: v, as: UTF8.self) }
            switch field {
            case .contentLength:
                guard !v.isEmpty, v.count <= 18, v.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let n = Int(value),
                      length == nil || length == n
                else { return .failure(.badRequest("bad Content-Length")) }
                length = n
            case .transferEncoding:
                return .failure(.badRequest("chunked request bodies are not supported; send Content-Length"))
            case .connection:
                connection += value.lowercased().split(separator: ",").map(\.trimmingSpaces)
            case .expect:
                expectsContinue = value.lowercased() == "100-continue"
            case .host:
                hosts += 1
                hostValid = hostValid && v.allSatisfy(Self.isAuthorityByte)
            case .kept(let name):
                request.headers[name] = request.headers[name].map { $0 + "," + value } ?? value
            }
        }
        var h = Head(request: request, bodyLength: length ?? 0,
                     keepAlive: http10 ? connection.contains("keep-alive") : !connection.contains("close"))
        h.connectionUpgrade = connection.contains("upgrade")
        h.http10 = http10
        h.expectsContinue = expectsContinue && !h.http10
        // RFC 9112 3.2: an HTTP/1.1 request without Host, or any with more
        // than one or an invalid one (not an authority, RFC 9110 7.2), is
        // 400. Well framed: the connection is kept.
        if hosts > 1 {
            h.refusal = .badRequest("more than one Host header field")
        } else if !hostValid {
            h.refusal = .badRequest("the Host header field is not a host and port")
        } else if hosts == 0, !http10 {
            h.refusal = .badRequest("an HTTP/1.1 request needs a Host header field")
        }
        for pair in query.utf8.split(separator: UInt8(ascii: "&")) {
            let kv = pair.split(separator: UInt8(ascii: "="), maxSplits: 1, omittingEmptySubsequences: false).map(Substring.init)
            guard let k = percentDecoded(kv[0], plusIsSpace: true), let v = percentDecoded(kv.count > 1 ? kv[1] : "", plusIsSpace: true) else {
                h.refusal = .badRequest("malformed percent-encoding in the query")
                break
            }
            h.request.query.append((k, v))
        }
        return .success(h)
    }

    /// The header fields the head reads: framing, and those copied into
    /// `HTTPRequest.headers`.
    private enum Field {
        case contentLength, transferEncoding, connection, expect, host
        case kept(String)

        static let table: [(lowerCased: [UInt8], field: Field)] =
            [("content-length", contentLength), ("transfer-encoding", transferEncoding), ("connection", connection), ("expect", expect),
             ("host", host)]
                .map { (Array($0.0.utf8), $0.1) } + HTTPRequest.headerNames.map { (Array($0.utf8), .kept($0)) }

        /// The field a name as sent (in any case) names, if the head reads it.
        static func named(_ name: ArraySlice<UInt8>) -> Field? {
            table.first { HTTPWire.equalsIgnoringCase(name, $0.lowerCased) }?.field
        }
    }

    /// Whether `bytes` are `lowerCased` (lower-case ASCII) in any case, as
    /// field names and authentication schemes are compared (RFC 9110 5.1,
    /// 11.1); only A–Z fold, so no other byte passes for a letter.
    /// A byte of `uri-host [":" port]` (RFC 3986 3.2.2: reg-name or IP literal).
    static func isAuthorityByte(_ c: UInt8) -> Bool {
        switch c {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"): true
        default: "-._~!$&'()*+,;=:[]%".utf8.contains(c)
        }
    }

    static func equalsIgnoringCase(_ bytes: some Collection<UInt8>, _ lowerCased: some Collection<UInt8>) -> Bool {
        bytes.count == lowerCased.count
            && zip(bytes, lowerCased).allSatisfy { ($0 &- UInt8(ascii: "A") < 26 ? $0 | 0x20 : $0) == $1 }
    }

    /// `s` with its %XX escapes decoded (and `+` as a space if asked), or
    /// nil if an escape is malformed or the result is not UTF-8.
    public static func percentDecoded(_ s: Substring, plusIsSpace: Bool = false) -> String? {
        // Most paths and queries escape nothing: a Substring is valid as it is.
        if !s.utf8.contains(where: { $0 == UInt8(ascii: "%") || (plusIsSpace && $0 == UInt8(ascii: "+")) }) { return String(s) }
        var out: [UInt8] = []
        var it = s.utf8.makeIterator()
        while let c = it.next() {
            switch c {
            case UInt8(ascii: "%"):
                guard let h = it.next().flatMap(hexValue), let l = it.next().flatMap(hexValue) else { return nil }
                out.append(h << 4 | l)
            case UInt8(ascii: "+") where plusIsSpace: out.append(space)
            default: out.append(c)
            }
        }
        return String(validating: out, as: UTF8.self)
    }

    /// The status line and header fields of an answer; without a `length`
    /// the body follows as chunks, or, not `chunked`, until the connection closes.
    /// `keepAlive`: say `Connection: keep-alive`, which an HTTP/1.0 client needs to keep the connection.
    public static func responseHead(_ r: HTTPResponse, length: Int?, chunked: Bool = true, close: Bool, keepAlive: Bool = false) -> [UInt8] {
        // Appended as bytes: built by interpolation it cost 9,000 instructions an answer.
        var out: [UInt8] = []
        out.reserveCapacity(160)
        func put(_ s: String) { out.append(contentsOf: s.utf8) }
        func field(_ name: String, _ value: String) { put(name); put(": "); put(value); put("\r\n") }
        put("HTTP/1.1 "); put(String(r.status)); put(" "); put(reason(r.status)); put("\r\n")
        if r.status != 204 {
            field("Content-Type", r.contentType)
            if let length { field("Content-Length", String(length)) } else if chunked { field("Transfer-Encoding", "chunked") }
        }
        for (name, value) in r.headers { field(name, value) }
        if close { field("Connection", "close") } else if keepAlive { field("Connection", "keep-alive") }
        put("\r\n")
        return out
    }

    /// One piece of a chunked body (never empty: an empty chunk ends it).
    public static func chunk(_ bytes: [UInt8]) -> [UInt8] {
        Array(String(bytes.count, radix: 16).utf8) + [cr, lf] + bytes + [cr, lf]
    }

    public static let lastChunk: [UInt8] = Array("0\r\n\r\n".utf8)

    /// The interim answer to `Expect: 100-continue`.
    public static let continueHead: [UInt8] = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)

    static func reason(_ status: Int) -> String {
        switch status {
        case 200: "OK"
        case 201: "Created"
        case 202: "Accepted"
        case 204: "No Content"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 412: "Precondition Failed"
        case 413: "Content Too Large"
        case 429: "Too Many Requests"
        case 503: "Service Unavailable"
        default: "Status"
        }
    }

    static let cr = UInt8(ascii: "\r"), lf = UInt8(ascii: "\n"), space = UInt8(ascii: " "), tab = UInt8(ascii: "\t")

    /// RFC 9110 5.6.2 `tchar`: what methods and field names are made of.
    static func isTokenChar(_ c: UInt8) -> Bool {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
             UInt8(ascii: "!"), UInt8(ascii: "#")...UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"),
             UInt8(ascii: "."), UInt8(ascii: "^")...UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"): true
        default: false
        }
    }

    static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
