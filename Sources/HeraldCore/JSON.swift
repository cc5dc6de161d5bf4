/// A JSON value that keeps object key order and number literals exactly as
/// received, so app payloads round-trip byte-for-byte in meaning.
public enum JSON: Sendable, Equatable {
    case null
    case bool(Bool)
    /// The literal text of a number, already validated against RFC 8259.
    case number(String)
    case string(String)
    case array([JSON])
    case object(JSONObject)

    public static func int(_ v: Int64) -> JSON { .number(String(v)) }
    public static func int(_ v: Int) -> JSON { .number(String(v)) }

    public var stringValue: String? { if case .string(let s) = self { return s }; return nil }
    public var objectValue: JSONObject? { if case .object(let o) = self { return o }; return nil }
    public var arrayValue: [JSON]? { if case .array(let a) = self { return a }; return nil }
    public var boolValue: Bool? { if case .bool(let b) = self { return b }; return nil }
    public var isNull: Bool { if case .null = self { return true }; return false }

    /// The value as an exact integer: no fraction, no exponent, fits in Int64.
    public var int64Value: Int64? {
        guard case .number(let text) = self else { return nil }
        return Int64(text)
    }
}

/// An ordered JSON object. Keys are unique (the parser refuses duplicates).
public struct JSONObject: Sendable, Equatable {
    public private(set) var keys: [String] = []
    public private(set) var values: [JSON] = []

    public init() {}

    public var count: Int { keys.count }

    public subscript(key: String) -> JSON? {
        get { keys.firstIndex(of: key).map { values[$0] } }
        set {
            if let i = keys.firstIndex(of: key) {
                if let v = newValue { values[i] = v } else { keys.remove(at: i); values.remove(at: i) }
            } else if let v = newValue {
                keys.append(key); values.append(v)
            }
        }
    }

    public var pairs: Zip2Sequence<[String], [JSON]> { zip(keys, values) }

    /// Appends a key known to be new (the parser checks with a set).
    mutating func appendNew(_ key: String, _ value: JSON) {
        keys.append(key)
        values.append(value)
    }
}

public struct JSONError: Error, Equatable, Sendable, CustomStringConvertible {
    public let message: String
    /// True when the input was not valid UTF-8 (WebSocket close 1007).
    public let invalidUTF8: Bool
    public var description: String { message }
}

// MARK: - Parsing

public enum JSONParser {
    public static let defaultMaxDepth = 64

    public static func parse(_ bytes: [UInt8], maxDepth: Int = defaultMaxDepth) throws(JSONError) -> JSON {
        try bytes.withUnsafeBufferPointer { buf throws(JSONError) in
            try parse(buf, maxDepth: maxDepth)
        }
    }

    public static func parse(_ text: String, maxDepth: Int = defaultMaxDepth) throws(JSONError) -> JSON {
        try parse(Array(text.utf8), maxDepth: maxDepth)
    }

    public static func parse(_ buf: UnsafeBufferPointer<UInt8>, maxDepth: Int = defaultMaxDepth) throws(JSONError) -> JSON {
        guard UTF8Validation.isValid(buf) else {
            throw JSONError(message: "body is not valid UTF-8", invalidUTF8: true)
        }
        var p = Parser(buf: buf, maxDepth: maxDepth)
        p.skipSpace()
        let v = try p.value(depth: 0)
        p.skipSpace()
        guard p.i == buf.count else { throw p.fail("unexpected data after the JSON value") }
        return v
    }

    private struct Parser {
        let buf: UnsafeBufferPointer<UInt8>
        let maxDepth: Int
        var i = 0

        init(buf: UnsafeBufferPointer<UInt8>, maxDepth: Int) { self.buf = buf; self.maxDepth = maxDepth }

        /// Keys checked for duplicates by a scan before a set takes over.
        static let keysScanned = 16

        func fail(_ msg: String) -> JSONError {
            JSONError(message: "malformed JSON at byte \(i): \(msg)", invalidUTF8: false)
        }

        mutating func skipSpace() {
            while i < buf.count {
                switch buf[i] {
                case 0x20, 0x09, 0x0A, 0x0D: i += 1
                default: return
                }
            }
        }

        mutating func literal(_ word: StaticString, _ v: JSON) throws(JSONError) -> JSON {
            let n = word.utf8CodeUnitCount
            guard i + n <= buf.count else { throw fail("truncated literal") }
            let w = word.utf8Start
            for k in 0..<n where buf[i + k] != w[k] { throw fail("unknown literal") }
            i += n
            return v
        }

        mutating func value(depth: Int) throws(JSONError) -> JSON {
            guard i < buf.count else { throw fail("unexpected end of input") }
            switch buf[i] {
            case UInt8(ascii: "{"): return try object(depth: depth + 1)
            case UInt8(ascii: "["): return try array(depth: depth + 1)
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "t"): return try literal("true", .bool(true))
            case UInt8(ascii: "f"): return try literal("false", .bool(false))
            case UInt8(ascii: "n"): return try literal("null", .null)
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
            default: throw fail("unexpected character")
            }
        }

        mutating func object(depth: Int) throws(JSONError) -> JSON {
            guard depth <= maxDepth else { throw fail("nested deeper than \(maxDepth)") }
            i += 1
            var obj = JSONObject()
            // Duplicate keys: a scan of the keys while the object is small
            // (most are), then a set, so wide objects parse in linear time.
            var seen: Set<String>? = nil
            skipSpace()
            if i < buf.count, buf[i] == UInt8(ascii: "}") { i += 1; return .object(obj) }
            while true {
                skipSpace()
                guard i < buf.count, buf[i] == UInt8(ascii: "\"") else { throw fail("expected a key") }
                let key = try string()
                skipSpace()
                guard i < buf.count, buf[i] == UInt8(ascii: ":") else { throw fail("expected ':'") }
                i += 1
                skipSpace()
                let v = try value(depth: depth)
                if seen == nil && obj.count == Self.keysScanned { seen = Set(obj.keys) }
                let duplicate = seen == nil ? obj.keys.contains(key) : !seen!.insert(key).inserted
                guard !duplicate else { throw fail("duplicate key \"\(key.prefix(64))\"") }
                obj.appendNew(key, v)
                skipSpace()
                guard i < buf.count else { throw fail("unterminated object") }
                if buf[i] == UInt8(ascii: ",") { i += 1; continue }
                if buf[i] == UInt8(ascii: "}") { i += 1; return .object(obj) }
                throw fail("expected ',' or '}'")
            }
        }

        mutating func array(depth: Int) throws(JSONError) -> JSON {
            guard depth <= maxDepth else { throw fail("nested deeper than \(maxDepth)") }
            i += 1
            var items: [JSON] = []
            skipSpace()
            if i < buf.count, buf[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
            while true {
                skipSpace()
                items.append(try value(depth: depth))
                skipSpace()
                guard i < buf.count else { throw fail("unterminated array") }
                if buf[i] == UInt8(ascii: ",") { i += 1; continue }
                if buf[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
                throw fail("expected ',' or ']'")
            }
        }

        mutating func number() throws(JSONError) -> JSON {
            let start = i
            if buf[i] == UInt8(ascii: "-") { i += 1 }
            func digits(_ p: inout Parser) -> Int {
                let s = p.i
                while p.i < p.buf.count, p.buf[p.i] >= 0x30, p.buf[p.i] <= 0x39 { p.i += 1 }
                return p.i - s
            }
            guard i < buf.count else { throw fail("truncated number") }
            if buf[i] == UInt8(ascii: "0") { i += 1 } else if digits(&self) == 0 { throw fail("bad number") }
            if i < buf.count, buf[i] == UInt8(ascii: ".") {
                i += 1
                guard digits(&self) > 0 else { throw fail("bad fraction") }
            }
            if i < buf.count, buf[i] == UInt8(ascii: "e") || buf[i] == UInt8(ascii: "E") {
                i += 1
                if i < buf.count, buf[i] == UInt8(ascii: "+") || buf[i] == UInt8(ascii: "-") { i += 1 }
                guard digits(&self) > 0 else { throw fail("bad exponent") }
            }
            return .number(String(decoding: UnsafeBufferPointer(rebasing: buf[start..<i]), as: UTF8.self))
        }

        mutating func hex4() throws(JSONError) -> UInt32 {
            guard i + 4 <= buf.count else { throw fail("truncated \\u escape") }
            var v: UInt32 = 0
            for _ in 0..<4 {
                let c = buf[i]
                let d: UInt32
                switch c {
                case 0x30...0x39: d = UInt32(c - 0x30)
                case 0x41...0x46: d = UInt32(c - 0x41 + 10)
                case 0x61...0x66: d = UInt32(c - 0x61 + 10)
                default: throw fail("bad \\u escape")
                }
                v = v << 4 | d
                i += 1
            }
            return v
        }

        mutating func string() throws(JSONError) -> String {
            i += 1
            let start = i
            // Fast path: no escapes.
            while i < buf.count {
                if buf.count - i >= 8, !JSON.anyNeedsEscape(buf.word(at: i)) {
                    i += 8
                    continue
                }
                let c = buf[i]
                if c == UInt8(ascii: "\"") {
                    let s = String(decoding: UnsafeBufferPointer(rebasing: buf[start..<i]), as: UTF8.self)
                    i += 1
                    return s
                }
                if c == UInt8(ascii: "\\") { break }
                if c < 0x20 { throw fail("control character in string") }
                i += 1
            }
            var out = [UInt8](UnsafeBufferPointer(rebasing: buf[start..<i]))
            while i < buf.count {
                let c = buf[i]
                if c == UInt8(ascii: "\"") { i += 1; return String(decoding: out, as: UTF8.self) }
                if c < 0x20 { throw fail("control character in string") }
                if c != UInt8(ascii: "\\") { out.append(c); i += 1; continue }
                i += 1
                guard i < buf.count else { break }
                let e = buf[i]
                i += 1
                switch e {
                case UInt8(ascii: "\""): out.append(0x22)
                case UInt8(ascii: "\\"): out.append(0x5C)
                case UInt8(ascii: "/"): out.append(0x2F)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if scalar >= 0xD800, scalar < 0xDC00 {
                        guard i + 2 <= buf.count, buf[i] == UInt8(ascii: "\\"), buf[i + 1] == UInt8(ascii: "u") else {
                            throw fail("unpaired surrogate")
                        }
                        i += 2
                        let low = try hex4()
                        guard low >= 0xDC00, low < 0xE000 else { throw fail("unpaired surrogate") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if scalar >= 0xDC00, scalar < 0xE000 {
                        throw fail("unpaired surrogate")
                    }
                    guard let u = Unicode.Scalar(scalar) else { throw fail("bad code point") }
                    out.append(contentsOf: UTF8.encode(u)!)
                default: throw fail("bad escape")
                }
            }
            throw fail("unterminated string")
        }
    }
}

/// Strict UTF-8 validation (no overlongs, no surrogates, nothing past U+10FFFF).
public enum UTF8Validation {
    public static func isValid(_ buf: UnsafeBufferPointer<UInt8>) -> Bool {
        var i = 0
        let n = buf.count
        while i < n {
            // ASCII, most of what is checked, eight bytes at a time.
            if n - i >= 8, buf.word(at: i) & 0x8080_8080_8080_8080 == 0 {
                i += 8
                continue
            }
            let c = buf[i]
            if c < 0x80 { i += 1; continue }
            let len: Int
            var lo: UInt8 = 0x80, hi: UInt8 = 0xBF
            switch c {
            case 0xC2...0xDF: len = 2
            case 0xE0: len = 3; lo = 0xA0
            case 0xE1...0xEC, 0xEE...0xEF: len = 3
            case 0xED: len = 3; hi = 0x9F
            case 0xF0: len = 4; lo = 0x90
            case 0xF1...0xF3: len = 4
            case 0xF4: len = 4; hi = 0x8F
            default: return false
            }
            guard i + len <= n else { return false }
            guard buf[i + 1] >= lo, buf[i + 1] <= hi else { return false }
            for k in 2..<len where buf[i + k] < 0x80 || buf[i + k] > 0xBF { return false }
            i += len
        }
        return true
    }

    public static func isValid(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBufferPointer { isValid($0) }
    }
}

// MARK: - Encoding

/// A value whose JSON text is written straight to bytes.
public protocol JSONWritable {
    func encode(into out: inout [UInt8])
}

extension JSONWritable {
    public var encoded: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(512)
        encode(into: &out)
        return out
    }
}

extension JSON: JSONWritable {}

extension JSON {
    public func encode(into out: inout [UInt8]) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .number(let n): out.append(contentsOf: n.utf8)
        case .string(let s): JSON.encodeString(s, into: &out)
        case .array(let a):
            out.append(UInt8(ascii: "["))
            for (k, v) in a.enumerated() {
                if k > 0 { out.append(UInt8(ascii: ",")) }
                v.encode(into: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let o):
            out.append(UInt8(ascii: "{"))
            for (k, (key, v)) in o.pairs.enumerated() {
                if k > 0 { out.append(UInt8(ascii: ",")) }
                JSON.encodeString(key, into: &out)
                out.append(UInt8(ascii: ":"))
                v.encode(into: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    public var encodedString: String { String(decoding: encoded, as: UTF8.self) }

    static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    /// Escapes only what JSON requires, each in its shortest form, so a
    /// value's encoding is never longer than any JSON text it was parsed
    /// from (`NotificationDraft` relies on it to skip measuring payloads).
    public static func encodeString(_ s: String, into out: inout [UInt8]) {
        out.append(0x22)
        var s = s
        s.withUTF8 { b in
            // Runs that need no escape are copied whole. The scan for the
            // next byte to escape skips eight bytes at a time: a 64 KiB
            // payload's strings are most of a notification's bytes.
            var start = 0, i = 0
            while i < b.count {
                if b.count - i >= 8, !anyNeedsEscape(b.word(at: i)) {
                    i += 8
                    continue
                }
                let c = b[i]
                i += 1
                guard c < 0x20 || c == 0x22 || c == 0x5C else { continue }
                out.append(contentsOf: UnsafeBufferPointer(rebasing: b[start..<i - 1]))
                start = i
                switch c {
                case 0x22: out.append(0x5C); out.append(0x22)
                case 0x5C: out.append(0x5C); out.append(0x5C)
                case 0x0A: out.append(0x5C); out.append(UInt8(ascii: "n"))
                case 0x0D: out.append(0x5C); out.append(UInt8(ascii: "r"))
                case 0x09: out.append(0x5C); out.append(UInt8(ascii: "t"))
                case 0x08: out.append(0x5C); out.append(UInt8(ascii: "b"))
                case 0x0C: out.append(0x5C); out.append(UInt8(ascii: "f"))
                default:
                    out.append(contentsOf: [0x5C, UInt8(ascii: "u"), 0x30, 0x30, hexDigits[Int(c >> 4)], hexDigits[Int(c & 15)]])
                }
            }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: b[start...]))
        }
        out.append(0x22)
    }

    /// Whether any of the eight bytes is a control character, a quote or a
    /// backslash. Exact, by the "has a zero byte" test on each condition
    /// (a byte below 0x20 is one that `- 0x20` borrows from without having
    /// its top bit set).
    @inline(__always) static func anyNeedsEscape(_ w: UInt64) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101, tops: UInt64 = 0x8080_8080_8080_8080
        func hasZeroByte(_ v: UInt64) -> Bool { (v &- ones) & ~v & tops != 0 }
        return (w &- ones &* 0x20) & ~w & tops != 0 || hasZeroByte(w ^ (ones &* 0x22)) || hasZeroByte(w ^ (ones &* 0x5C))
    }
}

extension JSON: ExpressibleByStringLiteral, ExpressibleByBooleanLiteral, ExpressibleByNilLiteral,
    ExpressibleByIntegerLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(nilLiteral: ()) { self = .null }
    public init(integerLiteral value: Int) { self = .number(String(value)) }
    public init(arrayLiteral elements: JSON...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSON)...) {
        var o = JSONObject()
        for (k, v) in elements { o[k] = v }
        self = .object(o)
    }
}

extension JSONObject: ExpressibleByDictionaryLiteral {
    public init(dictionaryLiteral elements: (String, JSON)...) {
        for (k, v) in elements { self[k] = v }
    }
}

extension Optional where Wrapped == String {
    /// `.string` or `.null`.
    public var json: JSON { map(JSON.string) ?? .null }
}

extension UnsafeBufferPointer<UInt8> {
    /// The eight bytes from `i` (which must be in bounds) as one word, for
    /// scans that skip a word at a time.
    @inline(__always) func word(at i: Int) -> UInt64 {
        UnsafeRawPointer(baseAddress! + i).loadUnaligned(as: UInt64.self)
    }
}
