import XCTest
import Foundation
import HeraldTestSupport
import HeraldCore
import HeraldGateway

/// `HTTPWire.parseHead`, which reads request heads straight off client
/// sockets: never traps; a head ends where its empty line does, and neither
/// a head nor a refusal depends on the bytes after it (pipelined requests);
/// an incomplete head is incomplete on its prefixes too; a head read in
/// pieces (`scanned` carried from piece to piece, as a connection does) is
/// read the same as in one; the method and the path are the request line's,
/// as sent.
final class HTTPWireFuzzTests: XCTestCase {

    static let target = FuzzTarget(
        name: "http",
        dictionary: ["\r\n", "\n", "\r\n\r\n", " ", ":", "GET ", "POST ", " HTTP/1.1", " HTTP/1.0", "Content-Length: ", "0", "65536",
                     "Transfer-Encoding: chunked", "Connection: close", "Connection: keep-alive", "Authorization: Bearer x",
                     "/v1/me/sync", "?", "&", "=", "%", "%2F", "%zz", "+", ";", "\r", "\u{0}"],
        maxLength: 3 * HTTPWire.maxHead,
        generate: { rng in Array(generate(&rng).utf8) },
        check: { bytes in check(bytes) })

    func testFuzzRequestHeads() { FuzzRunner.run(Self.target, test: self) }

    static let trailer = Array("GET /next HTTP/1.1\r\n\r\n".utf8)

    static func describe(_ p: HTTPWire.Parsed) -> String {
        switch p {
        case .incomplete: "incomplete"
        case .malformed(let e): "malformed \(e)"
        case .head(let h, let size):
            "head \(size) \(h.request.method) \(h.request.path) \(h.request.query) \(h.request.headers.sorted { $0.key < $1.key }) "
                + "\(h.bodyLength) \(h.keepAlive) \(String(describing: h.refusal))"
        }
    }

    static func check(_ bytes: [UInt8]) -> Outcome {
        let parsed = HTTPWire.parseHead(bytes[...])
        if let e = inPieces(bytes, parsed) { return .failed(e) }
        switch parsed {
        case .incomplete:
            for cut in [0, bytes.count / 2, max(0, bytes.count - 1)] {
                guard case .incomplete = HTTPWire.parseHead(bytes[..<cut]) else { return .failed("its \(cut)-byte prefix is not incomplete") }
            }
            return .rejected
        case .malformed(let e):
            guard e.code == .badRequest || e.code == .tooLarge else { return .failed("refused with \(e.code)") }
            guard describe(HTTPWire.parseHead((bytes + trailer)[...])) == describe(parsed) else {
                return .failed("bytes after a refused head change the answer")
            }
            return .rejected
        case .head(let h, let size):
            guard size > 0, size <= bytes.count, bytes[size - 1] == UInt8(ascii: "\n") else { return .failed("size \(size) does not end a line") }
            guard describe(HTTPWire.parseHead(bytes[..<size])) == describe(parsed),
                  describe(HTTPWire.parseHead((bytes + trailer)[...])) == describe(parsed)
            else { return .failed("the head depends on the bytes after it") }
            // The request line, read apart from the parser.
            let line = bytes[..<size].drop { $0 == UInt8(ascii: "\r") || $0 == UInt8(ascii: "\n") }.prefix { $0 != UInt8(ascii: "\n") }
            let parts = line.split(separator: UInt8(ascii: " "), omittingEmptySubsequences: false)
            guard parts.count == 3, h.request.method == String(decoding: parts[0], as: UTF8.self),
                  h.request.path == String(decoding: parts[1].prefix { $0 != UInt8(ascii: "?") }, as: UTF8.self)
            else { return .failed("method or path differ from the request line: \(describe(parsed))") }
            guard h.bodyLength >= 0, h.request.body.isEmpty else { return .failed("bad body: \(describe(parsed))") }
            // Past the empty lines before it, every CR of a head ends a line, and no NUL is in it.
            let text = bytes[..<size].drop { $0 == UInt8(ascii: "\r") || $0 == UInt8(ascii: "\n") }
            for i in text.indices where text[i] == 0 || (text[i] == UInt8(ascii: "\r") && (i + 1 == size || text[i + 1] != UInt8(ascii: "\n"))) {
                return .failed("a bare CR or a NUL at \(i) was taken: \(describe(parsed))")
            }
            return .accepted
        }
    }

    /// The bytes as a connection reads them, in pieces, the search for the
    /// head's end carried over: the first answer that is not `incomplete`
    /// (or the last) must be the answer on the whole.
    static func inPieces(_ bytes: [UInt8], _ whole: HTTPWire.Parsed) -> String? {
        var scanned = 0
        let cuts = [1, 2, bytes.count / 3, bytes.count / 2, bytes.count - 1, bytes.count].filter { $0 >= 0 && $0 <= bytes.count }
        for cut in cuts.sorted() {
            let p = HTTPWire.parseHead(bytes[..<cut], scanned: &scanned)
            if case .incomplete = p, cut < bytes.count { continue }
            return describe(p) == describe(whole) ? nil : "read in pieces up to \(cut) it is \(describe(p)), at once \(describe(whole))"
        }
        return nil
    }

    /// A head arriving one byte per read costs time linear in its size
    /// (searching it again from its start on every read was quadratic).
    func testHeadReadByteByByteTakesLinearTime() {
        func head(_ n: Int) -> [UInt8] {
            var h = Array("GET /v1/me/sync HTTP/1.1\r\n".utf8)
            while h.count < n - 40 { h += Array("X-Padding: \(String(repeating: "p", count: 50))\r\n".utf8) }
            return h + Array("Host: x\r\n\r\n".utf8)
        }
        func bestTime(_ bytes: [UInt8]) -> Double {
            var best = Double.infinity
            for _ in 0..<3 {
                let s = DispatchTime.now().uptimeNanoseconds
                var scanned = 0
                for cut in 1...bytes.count {
                    if case .incomplete = HTTPWire.parseHead(bytes[..<cut], scanned: &scanned) { continue }
                    XCTAssertEqual(cut, bytes.count, "the head ends at its empty line")
                    break
                }
                best = min(best, Double(DispatchTime.now().uptimeNanoseconds - s) / 1e9)
            }
            return best
        }
        let a = head(HTTPWire.maxHead / 16), b = head(HTTPWire.maxHead)
        let ta = bestTime(a), tb = bestTime(b)
        let sizeRatio = Double(b.count) / Double(a.count)
        print(String(format: "[fuzz] linear: http head byte by byte %d B %.2f ms → %d B %.2f ms (x%.1f)",
                     a.count, ta * 1000, b.count, tb * 1000, tb / max(ta, 1e-6)))
        XCTAssertLessThan(tb / max(ta, 1e-6), 4 * sizeRatio, "\(a.count) B took \(ta) s but \(b.count) B took \(tb) s — not linear")
    }

    /// A stream of empty lines is refused within a few bytes, however it is cut.
    func testEmptyLinesBeforeTheRequestLineAreCapped() {
        for eol in ["\r\n", "\n"] {
            var ok = Array(String(repeating: eol, count: HTTPWire.maxPreamble / 2).utf8) + Array("GET / HTTP/1.1\r\n\r\n".utf8)
            guard case .head = HTTPWire.parseHead(ok[...]) else { return XCTFail("\(HTTPWire.maxPreamble / 2) empty lines are taken") }
            ok = Array(String(repeating: eol, count: HTTPWire.maxPreamble + 1).utf8) + Array("GET / HTTP/1.1\r\n\r\n".utf8)
            guard case .malformed(let e) = HTTPWire.parseHead(ok[...]), e.code == .badRequest else {
                return XCTFail("\(HTTPWire.maxPreamble + 1) empty lines are refused")
            }
            let flood = Array(repeating: UInt8(ascii: "\n"), count: HTTPWire.maxPreamble + 1)
            guard case .malformed = HTTPWire.parseHead(flood[...]) else { return XCTFail("a flood of empty lines is refused at once") }
        }
    }

    /// RFC 9112 2.2: a bare CR in a field value is refused, not kept; so is
    /// a NUL (RFC 9110 5.5).
    func testBareCRAndNULInAFieldValueAreRefused() {
        for value in ["a\rb", "a\r", "\rb", "a\u{0}b", "a\r\r"] {
            let bytes = Array("GET / HTTP/1.1\r\nX-Other: \(value)\r\nHost: x\r\n\r\n".utf8)
            guard case .malformed(let e) = HTTPWire.parseHead(bytes[...]), e.code == .badRequest else {
                return XCTFail("\(value.debugDescription) in a field value: \(Self.describe(HTTPWire.parseHead(bytes[...])))")
            }
        }
        guard case .head = HTTPWire.parseHead(Array("GET / HTTP/1.1\nX-Other: a\r\nHost: x\r\n\n".utf8)[...]) else {
            return XCTFail("CRLF and LF line ends are taken")
        }
    }

    /// Field names are read in any case (RFC 9110 5.1); a name that only
    /// begins like a read one, or is a read one cut short, is not read.
    func testFieldNamesAreMatchedInAnyCaseAndWhole() {
        let bytes = Array(("POST /x HTTP/1.1\r\nCONTENT-length: 12\r\naUtHoRiZaTiOn: Bearer k\r\nContent-Lengthx: 5\r\n"
                           + "Content-Typ: a\r\nConnection: Close\r\n\r\n").utf8)
        guard case .head(let h, _) = HTTPWire.parseHead(bytes[...]) else { return XCTFail(Self.describe(HTTPWire.parseHead(bytes[...]))) }
        XCTAssertEqual(h.bodyLength, 12)
        XCTAssertEqual(h.request.headers, ["authorization": "Bearer k"])
        XCTAssertFalse(h.keepAlive)
    }

    /// RFC 9112 3.2: an HTTP/1.1 request without Host, or one with two, is
    /// refused (well framed: the connection goes on); HTTP/1.0 needs none.
    func testHostIsRequiredOnceOfHTTP11() {
        func refusal(_ head: String) -> String? {
            guard case .head(let h, _) = HTTPWire.parseHead(Array(head.utf8)[...]) else { XCTFail(head); return nil }
            return h.refusal?.message
        }
        XCTAssertNil(refusal("GET / HTTP/1.1\r\nhOsT: x\r\n\r\n"))
        XCTAssertNil(refusal("GET / HTTP/1.1\r\nHost:\r\n\r\n"), "empty: a target without an authority (RFC 9112 3.2)")
        XCTAssertNil(refusal("GET / HTTP/1.0\r\n\r\n"))
        XCTAssertEqual(refusal("GET / HTTP/1.1\r\nX-Host: x\r\n\r\n"), "an HTTP/1.1 request needs a Host header field")
        XCTAssertEqual(refusal("GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"), "more than one Host header field")
        XCTAssertEqual(refusal("GET / HTTP/1.0\r\nHost: x\r\nHost: x\r\n\r\n"), "more than one Host header field")
    }

    static func generate(_ rng: inout SplitMix64) -> String {
        let eol = rng.oneIn(4) ? "\n" : "\r\n"
        let chars = Array("abcXYZ019._@:-;,!+%~".utf8)
        let segments = (0..<rng.range(1, 6)).map { _ in
            rng.oneIn(5) ? "%" + String(rng.below(256), radix: 16) : String(decoding: (0..<rng.range(0, 10)).map { _ in rng.pick(chars) }, as: UTF8.self)
        }
        var target = "/" + segments.joined(separator: "/")
        if rng.oneIn(2) { target += "?token=a%2Bb&deviceId=d+1&cursor=" + String(rng.range(0, 99)) }
        var lines = [rng.pick(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]) + " " + target + " " + rng.pick(["HTTP/1.1", "HTTP/1.0"])]
        let fields = ["Host: x", "Content-Length: \(rng.range(0, 2_000_000))", "Connection: close", "Connection: keep-alive",
                      "Authorization: Bearer t", "Herald-Device: d", "If-Match: \"3\"", "Last-Event-ID: 7", "X-Other:  v ", "X-Other: a\rb",
                      "X-Other: a\u{0}", "X-Other: v\r",
                      "Content-Type: application/json"]
        for _ in 0..<rng.range(0, 6) { lines.append(rng.pick(fields)) }
        let head = (rng.oneIn(8) ? eol : "") + lines.joined(separator: eol) + eol + eol
        return rng.oneIn(3) ? head + "{\"x\":1}" : head
    }
}
