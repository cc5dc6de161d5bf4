/// Tag expressions of SPEC section 8: tags joined by `!`, `&&`, `||`
/// (that precedence, highest first) and parentheses, at most 20 tags.
public struct TagExpression: Sendable, Equatable, CustomStringConvertible {
    public indirect enum Node: Sendable, Equatable {
        case tag(String)
        case not(Node)
        case and(Node, Node)
        case or(Node, Node)
    }

    public static let maxTags = 20
    /// Bounds recursion for inputs such as `!!!!…` or `((((…`.
    static let maxDepth = 32
    static let maxLength = 4096

    public let root: Node
    /// The expression as given; this is what goes back on the wire.
    public let source: String
    public var description: String { source }

    public struct ParseError: Error, Sendable, CustomStringConvertible {
        public let description: String
    }

    public static func parse(_ text: String) throws(ParseError) -> TagExpression {
        guard text.utf8.count <= maxLength else { throw ParseError(description: "tag expression longer than \(maxLength) bytes") }
        var p = Parser(b: Array(text.utf8))
        let root = try p.orExpr(depth: 0)
        p.skip()
        guard p.i == p.b.count else { throw p.fail("unexpected '\(p.rest)'") }
        return TagExpression(root: root, source: text)
    }

    public func matches(_ tags: Set<String>) -> Bool { matches(tags.contains) }

    /// Evaluated against `has`, which says whether a tag is carried.
    public func matches(_ has: (String) -> Bool) -> Bool { Self.eval(root, has) }

    static func eval(_ n: Node, _ has: (String) -> Bool) -> Bool {
        switch n {
        case .tag(let t): return has(t)
        case .not(let a): return !eval(a, has)
        case .and(let a, let b): return eval(a, has) && eval(b, has)
        case .or(let a, let b): return eval(a, has) || eval(b, has)
        }
    }

    private struct Parser {
        let b: [UInt8]
        var i = 0
        var tagCount = 0

        var rest: String { String(decoding: b[min(i, b.count)...].prefix(20), as: UTF8.self) }
        func fail(_ m: String) -> ParseError { ParseError(description: "bad tag expression at \(i): \(m)") }

        mutating func skip() { while i < b.count, b[i] == 0x20 || b[i] == 0x09 { i += 1 } }

        mutating func eat(_ a: UInt8, _ c: UInt8) -> Bool {
            skip()
            guard i + 1 < b.count, b[i] == a, b[i + 1] == c else { return false }
            i += 2
            return true
        }

        mutating func orExpr(depth: Int) throws(ParseError) -> Node {
            guard depth < TagExpression.maxDepth else { throw fail("nested too deeply") }
            var left = try andExpr(depth: depth)
            while eat(0x7C, 0x7C) { left = .or(left, try andExpr(depth: depth)) }
            return left
        }

        mutating func andExpr(depth: Int) throws(ParseError) -> Node {
            var left = try unary(depth: depth)
            while eat(0x26, 0x26) { left = .and(left, try unary(depth: depth)) }
            return left
        }

        mutating func unary(depth: Int) throws(ParseError) -> Node {
            guard depth < TagExpression.maxDepth else { throw fail("nested too deeply") }
            skip()
            guard i < b.count else { throw fail("expected a tag") }
            if b[i] == UInt8(ascii: "!") {
                i += 1
                return .not(try unary(depth: depth + 1))
            }
            if b[i] == UInt8(ascii: "(") {
                i += 1
                let inner = try orExpr(depth: depth + 1)
                skip()
                guard i < b.count, b[i] == UInt8(ascii: ")") else { throw fail("expected ')'") }
                i += 1
                return inner
            }
            let start = i
            while i < b.count, Parser.isTagByte(b[i]) { i += 1 }
            guard i > start else { throw fail("expected a tag") }
            let tag = String(decoding: b[start..<i], as: UTF8.self)
            guard Identifiers.isTag(tag) else { throw fail("bad tag '\(tag)'") }
            tagCount += 1
            guard tagCount <= TagExpression.maxTags else { throw fail("more than \(TagExpression.maxTags) tags") }
            return .tag(tag)
        }

        static func isTagByte(_ c: UInt8) -> Bool {
            switch c {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"), UInt8(ascii: "@"),
                 UInt8(ascii: "#"), UInt8(ascii: "."), UInt8(ascii: ":"), UInt8(ascii: "-"): return true
            default: return false
            }
        }
    }
}
