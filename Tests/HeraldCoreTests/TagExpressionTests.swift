import XCTest
import Foundation
@testable import HeraldCore

final class TagExpressionTests: XCTestCase {
    typealias Node = TagExpression.Node

    func parse(_ s: String, file: StaticString = #filePath, line: UInt = #line) -> TagExpression? {
        do { return try TagExpression.parse(s) } catch {
            XCTFail("\(s.prefix(80)): \(error)", file: file, line: line)
            return nil
        }
    }

    func refused(_ s: String) -> Bool { (try? TagExpression.parse(s)) == nil }

    func testSingleTag() {
        XCTAssertEqual(parse("lang:it")?.root, .tag("lang:it"))
        XCTAssertEqual(parse("  a_b@c#d.e:f-9  ")?.root, .tag("a_b@c#d.e:f-9"))
    }

    func testPrecedenceNotOverAndOverOr() {
        XCTAssertEqual(parse("a || b && c")?.root, .or(.tag("a"), .and(.tag("b"), .tag("c"))))
        XCTAssertEqual(parse("a && b || c")?.root, .or(.and(.tag("a"), .tag("b")), .tag("c")))
        XCTAssertEqual(parse("!a && b")?.root, .and(.not(.tag("a")), .tag("b")))
        XCTAssertEqual(parse("!a || b")?.root, .or(.not(.tag("a")), .tag("b")))
        XCTAssertEqual(parse("a && !b || !c && d")?.root,
                       .or(.and(.tag("a"), .not(.tag("b"))), .and(.not(.tag("c")), .tag("d"))))
        XCTAssertEqual(parse("!!a")?.root, .not(.not(.tag("a"))))
    }

    func testParenthesesOverridePrecedence() {
        XCTAssertEqual(parse("(a || b) && c")?.root, .and(.or(.tag("a"), .tag("b")), .tag("c")))
        XCTAssertEqual(parse("!(a && b)")?.root, .not(.and(.tag("a"), .tag("b"))))
        XCTAssertEqual(parse("((a))")?.root, .tag("a"))
        XCTAssertEqual(parse("a && (b || (c && !d))")?.root,
                       .and(.tag("a"), .or(.tag("b"), .and(.tag("c"), .not(.tag("d"))))))
    }

    func testWhitespaceIsOptionalAndFlexible() {
        let expected: Node = .and(.tag("a"), .not(.or(.tag("b"), .tag("c"))))
        for s in ["a&&!(b||c)", "a && !(b || c)", "  a\t&&\t! ( b ||c )  ", "a&& !( b|| c)"] {
            XCTAssertEqual(parse(s)?.root, expected, s)
        }
    }

    func testSourceIsPreservedVerbatim() {
        for s in ["lang:it && !muted", "  a  ||b", "(a)", "!!x"] {
            XCTAssertEqual(parse(s)?.source, s)
            XCTAssertEqual(parse(s)?.description, s)
        }
    }

    func testLeftAssociativeChains() {
        XCTAssertEqual(parse("a || b || c")?.root, .or(.or(.tag("a"), .tag("b")), .tag("c")))
        XCTAssertEqual(parse("a && b && c")?.root, .and(.and(.tag("a"), .tag("b")), .tag("c")))
    }

    func testTagLimit() {
        let twenty = (0..<20).map { "t\($0)" }
        XCTAssertNotNil(parse(twenty.joined(separator: " || ")))
        XCTAssertNotNil(parse(twenty.joined(separator: " && ")))
        XCTAssertTrue(refused((twenty + ["t20"]).joined(separator: " || ")))
        XCTAssertTrue(refused((twenty + ["t20"]).joined(separator: " && ")))
        // Occurrences count, in any mix of operators, also repeated tags.
        XCTAssertTrue(refused(Array(repeating: "a", count: 21).joined(separator: "&&")))
        let mixed = "(" + (0..<7).map { "!t\($0)" }.joined(separator: " && ") + ") || ("
            + (7..<14).map { "t\($0)" }.joined(separator: " || ") + ") && " + (14..<21).map { "t\($0)" }.joined(separator: "&&")
        XCTAssertTrue(refused(mixed))
        XCTAssertEqual(TagExpression.maxTags, 20)
    }

    func testLargestLegitimateExpressionParses() {
        // 20 tags of the maximum 160 characters, negated and parenthesised.
        let tags = (0..<20).map { String(format: "%03d", $0) + String(repeating: "t", count: 157) }
        let text = "(" + tags.map { "!" + $0 }.joined(separator: " && ") + ") || " + "x"
        XCTAssertTrue(refused(text), "21 tags")
        let ok = "(" + tags.prefix(10).map { "!" + $0 }.joined(separator: " && ") + ") || ("
            + tags.suffix(10).joined(separator: " || ") + ")"
        XCTAssertEqual(parse(ok)?.source, ok)
    }

    func testDeepNestingIsRefusedWithoutCrashing() {
        XCTAssertNotNil(parse(String(repeating: "(", count: 10) + "a" + String(repeating: ")", count: 10)))
        XCTAssertNotNil(parse(String(repeating: "!", count: 10) + "a"))
        XCTAssertTrue(refused(String(repeating: "(", count: 1000) + "a" + String(repeating: ")", count: 1000)))
        XCTAssertTrue(refused(String(repeating: "!", count: 4000) + "a"))
        XCTAssertTrue(refused(String(repeating: "!(", count: 1000) + "a" + String(repeating: ")", count: 1000)))
        XCTAssertTrue(refused(String(repeating: "(", count: 100_000)))
        XCTAssertTrue(refused(String(repeating: "!", count: 1_000_000)))
    }

    func testBadTagsAndOperatorsAreRefused() {
        for s in ["", " ", "a ||", "|| a", "a &&", "&& a", "!", "a !", "a & b", "a | b", "a &&& b", "a ||| b",
                  "a b", "()", "(a", "a)", "(a))", "((a)", "a && ()", "a || !", "é", "a,b", "a+b", "a/b",
                  "a && é", String(repeating: "t", count: 161), "x || " + String(repeating: "t", count: 161),
                  "a ^ b", "a and b", "!()", "(&& a)", "a (b)", "a !b"] {
            XCTAssertTrue(refused(s), s.debugDescription)
        }
        XCTAssertNotNil(parse(String(repeating: "t", count: 160)))
    }

    func testMatchesTruthTables() {
        let a = parse("a")!, notA = parse("!a")!
        let and = parse("a && b")!, or = parse("a || b")!
        let prec = parse("a || b && c")!
        let paren = parse("(a || b) && c")!
        let notAnd = parse("!a && b")!
        let notParen = parse("!(a && b)")!
        for mask in 0..<8 {
            let x = mask & 1 != 0, y = mask & 2 != 0, z = mask & 4 != 0
            var tags = Set<String>(["other"])
            if x { tags.insert("a") }; if y { tags.insert("b") }; if z { tags.insert("c") }
            let ctx = "a=\(x) b=\(y) c=\(z)"
            XCTAssertEqual(a.matches(tags), x, ctx)
            XCTAssertEqual(notA.matches(tags), !x, ctx)
            XCTAssertEqual(and.matches(tags), x && y, ctx)
            XCTAssertEqual(or.matches(tags), x || y, ctx)
            XCTAssertEqual(prec.matches(tags), x || (y && z), ctx)
            XCTAssertEqual(paren.matches(tags), (x || y) && z, ctx)
            XCTAssertEqual(notAnd.matches(tags), !x && y, ctx)
            XCTAssertEqual(notParen.matches(tags), !(x && y), ctx)
        }
    }

    func testMatchesIsExactAndCaseSensitive() {
        let e = parse("lang:it && !muted")!
        XCTAssertTrue(e.matches(["lang:it", "user:alice"]))
        XCTAssertFalse(e.matches(["lang:it", "muted"]))
        XCTAssertFalse(e.matches(["Lang:it"]))
        XCTAssertFalse(e.matches(["lang:itx"]))
        XCTAssertFalse(e.matches(["lang"]))
        XCTAssertFalse(e.matches([]))
        XCTAssertTrue(parse("!x")!.matches([]))
    }

    func testEquality() {
        XCTAssertEqual(parse("a&&b"), parse("a&&b"))
        XCTAssertNotEqual(parse("a&&b"), parse("b&&a"))
    }
}
