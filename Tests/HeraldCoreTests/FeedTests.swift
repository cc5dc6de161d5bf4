import XCTest
@testable import HeraldCore

final class FeedPositionTests: XCTestCase {
    func testFeedStateAccepts() {
        let f = FeedState(head: 50, floor: 10)
        XCTAssertFalse(f.accepts(cursor: 9), "older than what is retained")
        XCTAssertTrue(f.accepts(cursor: 10), "at the floor: every later change is kept")
        XCTAssertTrue(f.accepts(cursor: 30))
        XCTAssertTrue(f.accepts(cursor: 50), "at the head")
        XCTAssertFalse(f.accepts(cursor: 51), "ahead of the feed")
        XCTAssertFalse(f.accepts(cursor: -1))
        let empty = FeedState()
        XCTAssertTrue(empty.accepts(cursor: 0))
        XCTAssertFalse(empty.accepts(cursor: 1))
    }

    func testResumable() {
        let f = FeedState(head: 50, floor: 10)
        XCTAssertEqual(FeedPosition(cursor: 20, epoch: "E").resumable(in: f, epoch: "E"), 20)
        XCTAssertEqual(FeedPosition(cursor: 20, epoch: nil).resumable(in: f, epoch: "E"), 20, "no epoch: the current one")
        XCTAssertNil(FeedPosition(cursor: 20, epoch: "OLD").resumable(in: f, epoch: "E"), "epoch mismatch")
        XCTAssertNil(FeedPosition(cursor: 20, epoch: "E").resumable(in: f, epoch: "E.1"), "view generation changed")
        XCTAssertNil(FeedPosition(cursor: 20, epoch: "").resumable(in: f, epoch: "E"))
        XCTAssertNil(FeedPosition(cursor: nil, epoch: "E").resumable(in: f, epoch: "E"), "no cursor")
        XCTAssertNil(FeedPosition(cursor: nil, epoch: nil).resumable(in: f, epoch: "E"))
        XCTAssertNil(FeedPosition(cursor: 9, epoch: "E").resumable(in: f, epoch: "E"), "below the floor")
        XCTAssertEqual(FeedPosition(cursor: 10, epoch: "E").resumable(in: f, epoch: "E"), 10)
        XCTAssertEqual(FeedPosition(cursor: 50, epoch: "E").resumable(in: f, epoch: "E"), 50)
        XCTAssertNil(FeedPosition(cursor: 51, epoch: "E").resumable(in: f, epoch: "E"), "ahead of the head")
        XCTAssertNil(FeedPosition(cursor: 51, epoch: nil).resumable(in: f, epoch: "E"))
    }
}

final class PageTokenTests: XCTestCase {
    func testRoundTrip() {
        for k in [HistoryKey(createdAt: T0, id: "n_01J00000000000000000000000"), HistoryKey(createdAt: 0, id: NotificationID.make(now: 0)),
                  HistoryKey(createdAt: -5, id: "n_ZZZZZZZZZZZZZZZZZZZZZZZZZZ")] {
            let s = PageToken.encode(k)
            XCTAssertTrue(s.utf8.allSatisfy { c in
                (0x30...0x39).contains(c) || (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c) || c == 0x2D || c == 0x5F
            }, "URL-safe: \(s)")
            XCTAssertEqual(PageToken.decode(s), k)
        }
        let real = HistoryKey(Note.sample())
        XCTAssertEqual(PageToken.decode(PageToken.encode(real)), real)
    }

    func testGarbageIsNil() {
        let b = { (s: String) in Base64URL.encode(Array(s.utf8)) }
        for s in ["", "!!!", "====", "abc=", "not a token", "Zh", b("no-colon"), b(":id"), b("abc:id"), b("123:"),
                  b("1.5:id"), b("99999999999999999999:id"), b("12:" + String(repeating: "x", count: 129)),
                  Base64URL.encode([0x31, 0x3A, 0xFF, 0xFE]), String(repeating: "A", count: 300), b(" 12:id"),
                  // Ids of no form the gateway gives: they name nothing.
                  b("12:x"), b("12:a:b:c"), b("12:n_01J0000000000000000000000"), b("12:n_01J00000000000000000000\u{0}0"),
                  b("12:n_01J0000000000000000000000U")] {
            XCTAssertNil(PageToken.decode(s), s.prefix(40).description)
        }
    }
}

final class HistoryKeyTests: XCTestCase {
    func testNewestFirstThenHigherIdFirst() {
        let a = HistoryKey(createdAt: T0 + 1, id: "n_A")
        let b = HistoryKey(createdAt: T0, id: "n_B")
        let c = HistoryKey(createdAt: T0, id: "n_A")
        XCTAssertTrue(a < b)
        XCTAssertTrue(b < c)
        XCTAssertFalse(c < b)
        XCTAssertFalse(c < c)
        XCTAssertEqual([c, a, b].sorted(), [a, b, c])
    }

    func testIdTieBreakIsByteOrder() {
        let ids = (0..<200).map { _ in NotificationID.make(now: T0) }
        let sorted = ids.map { HistoryKey(createdAt: T0, id: $0) }.sorted().map(\.id)
        let byBytes = ids.sorted { Array($1.utf8).lexicographicallyPrecedes(Array($0.utf8)) }
        XCTAssertEqual(sorted, byBytes)
    }
}

final class HeapTests: XCTestCase {
    func testPopsInAscendingOrder() {
        var rng = SystemRandomNumberGenerator()
        for n in [0, 1, 2, 3, 10, 257, 1000] {
            var h = Heap<Int>()
            let xs = (0..<n).map { _ in Int.random(in: -50...50, using: &rng) }
            for x in xs { h.push(x) }
            XCTAssertEqual(h.count, n)
            XCTAssertEqual(h.peek, xs.min())
            var out: [Int] = []
            while let x = h.pop() { out.append(x) }
            XCTAssertEqual(out, xs.sorted())
            XCTAssertEqual(h.count, 0)
            XCTAssertNil(h.peek)
            XCTAssertNil(h.pop())
        }
    }

    func testInterleavedPushAndPop() {
        var h = Heap<Int>()
        var model: [Int] = []
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<5000 {
            if Bool.random(using: &rng) || model.isEmpty {
                let x = Int.random(in: 0...100, using: &rng)
                h.push(x); model.append(x)
            } else {
                let m = model.min()!
                XCTAssertEqual(h.pop(), m)
                model.remove(at: model.firstIndex(of: m)!)
            }
            XCTAssertEqual(h.peek, model.min())
            XCTAssertEqual(h.count, model.count)
        }
    }

    func testWithHistoryKeysGivesHistoryOrder() {
        var h = Heap<HistoryKey>()
        let keys = (0..<50).map { HistoryKey(createdAt: T0 + Millis($0 % 7), id: "n_\($0)") }
        for k in keys.shuffled() { h.push(k) }
        var out: [HistoryKey] = []
        while let k = h.pop() { out.append(k) }
        XCTAssertEqual(out, keys.sorted())
    }
}
