import XCTest
import HeraldTestSupport
import HeraldCore

/// `TagExpression.parse` and `matches`, checked against an independent
/// reference parser written from SPEC section 8.
final class TagFuzzTests: XCTestCase {
    typealias Node = TagExpression.Node

    static let target = FuzzTarget(
        name: "tags",
        dictionary: ["&&", "||", "!", "(", ")", " ", "\t", "a", "b", "lang:it", "muted", "user:alice", "platform:ios",
                     "device:d1", "x_y@z#1.2:3-4", "&", "|", "!(", ")&&", "||!", "((", "))", "&&&", "|||",
                     String(repeating: "t", count: 160), String(repeating: "t", count: 161)],
        maxLength: 8192,
        generate: { rng in Array(generateExpression(&rng, depth: 0).utf8) },
        check: { bytes in check(String(decoding: bytes, as: UTF8.self)) })

    func testFuzzTagExpressions() { FuzzRunner.run(Self.target, test: self) }

    static func check(_ text: String) -> Outcome {
        let expected = Reference.parse(Array(text.utf8))
        let got: TagExpression
        do throws(TagExpression.ParseError) { got = try TagExpression.parse(text) } catch {
            if let expected { return .failed("refused (\(error.description)) but the reference parses it as \(expected)") }
            if error.description.isEmpty { return .failed("refused without a message") }
            return .rejected
        }
        guard let expected else { return .failed("accepted \(got.root) but the reference refuses it") }
        guard got.root == expected else { return .failed("parsed as \(got.root), the reference says \(expected)") }
        guard got.source == text else { return .failed("source not kept verbatim") }
        if let why = expressionProblem(got) { return .failed(why) }
        // Printing and re-parsing gives the same tree.
        let printed = render(got.root)
        guard let again = try? TagExpression.parse(printed) else { return .failed("its rendering \(printed) does not parse") }
        guard again.root == got.root else { return .failed("its rendering \(printed) parses differently") }
        // matches agrees with a plain evaluation, and with the negation.
        let negated = try? TagExpression.parse("!(" + text + ")")
        let tags = collectTags(got.root)
        var rng = SplitMix64(seed: fnv1a(Array(text.utf8)))
        for _ in 0..<8 {
            var set = Set(tags.filter { _ in rng.oneIn(2) })
            if rng.oneIn(4) { set.insert("unrelated") }
            let m = got.matches(set)
            guard m == evaluate(got.root, set) else { return .failed("matches(\(set.sorted())) is \(m)") }
            if let negated, negated.matches(set) == m { return .failed("!(e) matches \(set.sorted()) like e does") }
        }
        return .accepted
    }

    /// Invariants of any accepted expression.
    static func expressionProblem(_ e: TagExpression) -> String? {
        let tags = collectTags(e.root)
        if tags.count > TagExpression.maxTags { return "\(tags.count) tags accepted" }
        if let bad = tags.first(where: { !Identifiers.isTag($0) }) { return "bad tag accepted: \(bad.debugDescription)" }
        if e.source.utf8.count > 4096 { return "expression over 4096 bytes accepted" }
        return nil
    }

    static func collectTags(_ n: Node) -> [String] {
        switch n {
        case .tag(let t): return [t]
        case .not(let a): return collectTags(a)
        case .and(let a, let b), .or(let a, let b): return collectTags(a) + collectTags(b)
        }
    }

    static func evaluate(_ n: Node, _ s: Set<String>) -> Bool {
        switch n {
        case .tag(let t): return s.contains(t)
        case .not(let a): return !evaluate(a, s)
        case .and(let a, let b): return evaluate(a, s) && evaluate(b, s)
        case .or(let a, let b): return evaluate(a, s) || evaluate(b, s)
        }
    }

    /// Minimal parentheses: only where precedence or grouping needs them.
    static func render(_ n: Node) -> String {
        func prec(_ n: Node) -> Int {
            switch n { case .or: 1; case .and: 2; case .not, .tag: 3 }
        }
        switch n {
        case .tag(let t): return t
        case .not(let a): return "!" + (prec(a) < 3 ? "(\(render(a)))" : render(a))
        case .and(let a, let b):
            return (prec(a) < 2 ? "(\(render(a)))" : render(a)) + " && " + (prec(b) <= 2 ? "(\(render(b)))" : render(b))
        case .or(let a, let b):
            return render(a) + " || " + (prec(b) <= 1 ? "(\(render(b)))" : render(b))
        }
    }

    static func generateExpression(_ rng: inout SplitMix64, depth: Int) -> String {
        let ws = { (r: inout SplitMix64) -> String in r.pick(["", " ", "  ", "\t", " \t"]) }
        if depth > 4 || rng.oneIn(3) {
            let t = rng.pick(["a", "b", "c", "lang:it", "muted", "x_y@z#1.2:3-4", "beta", "v2"])
            return ws(&rng) + t + ws(&rng)
        }
        switch rng.below(4) {
        case 0: return "!" + generateExpression(&rng, depth: depth + 1)
        case 1: return "(" + generateExpression(&rng, depth: depth + 1) + ")"
        case 2: return generateExpression(&rng, depth: depth + 1) + "&&" + generateExpression(&rng, depth: depth + 1)
        default: return generateExpression(&rng, depth: depth + 1) + "||" + generateExpression(&rng, depth: depth + 1)
        }
    }

    /// A tokenizing, precedence-climbing reading of SPEC section 8: tags of
    /// `A-Z a-z 0-9 _ @ # . : -` (1–160), `!` over `&&` over `||`, left
    /// associative, parentheses, spaces and tabs between tokens, at most 20
    /// tags, at most 4096 bytes, and at most 31 levels of `!` and `(` inside
    /// one another.
    enum Reference {
        enum Tok: Equatable { case tag(String), not, and, or, open, close }

        static func tokens(_ b: [UInt8]) -> [Tok]? {
            var out: [Tok] = []
            var i = 0
            func isTag(_ c: UInt8) -> Bool {
                (c >= 0x61 && c <= 0x7A) || (c >= 0x41 && c <= 0x5A) || (c >= 0x30 && c <= 0x39) || "_@#.:-".utf8.contains(c)
            }
            while i < b.count {
                let c = b[i]
                if c == 0x20 || c == 0x09 { i += 1; continue }
                if c == UInt8(ascii: "!") { out.append(.not); i += 1; continue }
                if c == UInt8(ascii: "(") { out.append(.open); i += 1; continue }
                if c == UInt8(ascii: ")") { out.append(.close); i += 1; continue }
                if c == UInt8(ascii: "&") || c == UInt8(ascii: "|") {
                    guard i + 1 < b.count, b[i + 1] == c else { return nil }
                    out.append(c == UInt8(ascii: "&") ? .and : .or); i += 2; continue
                }
                guard isTag(c) else { return nil }
                let s = i
                while i < b.count, isTag(b[i]) { i += 1 }
                guard i - s <= 160 else { return nil }
                out.append(.tag(String(decoding: b[s..<i], as: UTF8.self)))
            }
            return out
        }

        static func parse(_ b: [UInt8]) -> Node? {
            guard b.count <= 4096, let toks = tokens(b) else { return nil }
            var p = 0, tagCount = 0, maxLevel = 0
            func primary(_ level: Int) -> Node? {
                maxLevel = max(maxLevel, level)
                guard p < toks.count else { return nil }
                switch toks[p] {
                case .not: p += 1; return primary(level + 1).map { .not($0) }
                case .open:
                    p += 1
                    guard let inner = expr(level + 1, minPrec: 1), p < toks.count, toks[p] == .close else { return nil }
                    p += 1
                    return inner
                case .tag(let t): p += 1; tagCount += 1; return .tag(t)
                default: return nil
                }
            }
            func expr(_ level: Int, minPrec: Int) -> Node? {
                guard level < 64, var left = primary(level) else { return nil }
                while p < toks.count {
                    let prec: Int
                    switch toks[p] { case .or: prec = 1; case .and: prec = 2; default: return left }
                    guard prec >= minPrec else { return left }
                    let op = toks[p]
                    p += 1
                    guard let right = expr(level, minPrec: prec + 1) else { return nil }
                    left = op == .or ? .or(left, right) : .and(left, right)
                }
                return left
            }
            guard let root = expr(0, minPrec: 1), p == toks.count, tagCount <= 20, maxLevel <= 31 else { return nil }
            return root
        }
    }
}
