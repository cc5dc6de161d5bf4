import XCTest
import HeraldTestSupport
import HeraldCore
import HeraldStores
@testable import HeraldGateway

/// The catch-up-then-live hand-over (Subscription): every change once, in
/// order, welcome only after the whole catch-up, whatever commits land
/// between the pages and however slowly the client reads.
final class HandOverTests: XCTestCase {
    /// Publishes land at every point of a paged catch-up (before a page is
    /// read, after it, while the client is not reading): the client gets
    /// seqs 1...head exactly once, in order, across catch-up and live.
    func testCommitsDuringTheCatchUpAreNeitherLostNorRepeated() {
        for seed in 0..<8 {
            var rng = SplitMix64(seed: UInt64(seed))
            let h = Harness()
            h.publishSettled("u", count: 1500 + Int(rng.next() % 500), payloadBytes: 200)
            let s = h.webSocket()
            h.hello(s, user: "u", cursor: 0)
            var published = 0
            // Interleave: the engine runs some, the loop runs some, publishes
            // land, the client reads now and then.
            for step in 0..<400 where !s.types.contains("welcome") || step % 7 != 0 {
                switch rng.next() % 5 {
                case 0: h.publish("u", "late\(published)"); published += 1
                case 1: h.runEngine()
                case 2: h.loop.drain()
                case 3: s.read()
                default: h.settle()
                }
            }
            h.settle(); s.read(); h.settle(); s.read()
            let head = try! h.gateway.soleEngine.reads.feed(UserKey(app: Harness.app.id, user: "u")).head
            let seqs = changeSeqs(s.frames)
            XCTAssertEqual(seqs, Array(1...head), "seed \(seed): every change once, in order")
            let w = s.types.firstIndex(of: "welcome")!
            XCTAssertEqual(s.frames[w].int("cursor").map { $0 <= head }, true)
            XCTAssertTrue(s.types[..<w].allSatisfy { $0 == "changes" }, "seed \(seed): only catch-up before welcome")
            XCTAssertEqual(changeSeqs(Array(s.frames[..<w])).last, s.frames[w].int("cursor"),
                           "seed \(seed): welcome at the position the catch-up reached")
            XCTAssertNil(s.session.closeRequest)
        }
    }

    /// A client that reads nothing gets about one page past the drain mark,
    /// never the whole history (which once had it closed as a slow consumer).
    func testCatchUpWaitsForTheClientToRead() {
        let h = Harness()
        h.publishSettled("u", count: 120, payloadBytes: 60_000)   // ~7 MB
        let s = h.webSocket()
        h.hello(s, user: "u", cursor: 0)
        h.settle()
        XCTAssertLessThan(s.session.backlog, Subscription.drainedBelow + 2 * PageBounds.webSocket.bytes)
        XCTAssertNil(s.session.closeRequest, "catch-up volume never closes the connection")
        var rounds = 0
        while !s.types.contains("welcome") {
            s.read(); h.settle()
            rounds += 1
            XCTAssertLessThan(rounds, 1000)
        }
        XCTAssertEqual(changeSeqs(s.frames), Array(1...120))
        XCTAssertGreaterThan(rounds, 8, "paged as the client read")
    }

    /// A reset goes out whole, in frames of at most 500, every frame at the
    /// reset's position, `final` on the last; welcome carries the unread count.
    func testResetIsPagedAndComplete() {
        let h = Harness()
        h.publishSettled("u", count: 1234)
        let s = h.webSocket()
        h.hello(s, user: "u")
        for _ in 0..<50 { h.settle(); s.read() }
        let resets = s.frames.filter { $0["type"] == "reset" }
        XCTAssertEqual(resets.map { $0["notifications"]!.arrayValue!.count }, [500, 500, 234])
        XCTAssertEqual(resets.map { $0["final"] }, [false, false, true])
        XCTAssertTrue(resets.allSatisfy { $0.int("cursor") == 1234 })
        XCTAssertEqual(s.types.last, "welcome")
        XCTAssertEqual(s.frames.last!.int("unread"), 1234)
        XCTAssertEqual(s.frames.last!.int("cursor"), 1234)
    }

    /// Live changes outgrowing the buffer during a stalled catch-up are
    /// dropped and read from the store instead: still none lost.
    func testOverflowingLiveBufferFallsBackToTheStore() {
        let h = Harness()
        h.publishSettled("u", count: 100, payloadBytes: 60_000)
        let s = h.webSocket()
        h.hello(s, user: "u", cursor: 0)
        h.settle()
        // The client reads nothing while 40 x 60 KB (> the 1 MiB buffer) land.
        for i in 0..<40 { h.publish("u", "live\(i)", payloadBytes: 60_000) }
        h.settle()
        while !s.types.contains("welcome") { s.read(); h.settle() }
        s.read()
        XCTAssertEqual(changeSeqs(s.frames), Array(1...140))
    }

    /// With a reader connection, a page's reply can arrive after live
    /// changes committed after its snapshot. If those overflowed the buffer
    /// and were dropped meanwhile, that page must not complete the
    /// catch-up: a later read brings them.
    func testPageInFlightWhileTheBufferOverflowsDoesNotCompleteTheCatchUp() {
        let store = FailingStore()
        store.offersReader = true
        let h = Harness(store: store)
        h.publishSettled("u", count: 3, payloadBytes: 10)
        let s = h.webSocket()
        h.hello(s, user: "u", cursor: 0)
        h.runEngine()          // admitted and following
        h.loop.drain()         // the first page is requested
        let reply = h.loop.capture { h.gateway.reads.runQueued() }   // read: seqs 1-3, the reply held back
        for i in 0..<20 { h.publish("u", "big\(i)", payloadBytes: 60_000) }
        h.runEngine()          // committed after the snapshot; deliveries posted first
        h.loop.post(contentsOf: reply)
        h.loop.drain()         // the live changes overflow the buffer, then the stale page arrives
        while !s.types.contains("welcome") { h.settle(); s.read() }
        XCTAssertEqual(changeSeqs(s.frames), Array(1...23), "nothing lost across the dropped buffer")
        XCTAssertEqual(s.frames.first { $0["type"] == "welcome" }?.int("cursor").map { $0 >= 3 }, true)
    }

    /// A `sync` on a live connection re-sends in the catch-up form, then its
    /// ack at the position reached; live changes resume after it.
    func testSyncReplaysThenAcks() {
        let h = Harness()
        h.publishSettled("u", count: 700)
        let s = h.webSocket()
        h.hello(s, user: "u", cursor: 700)
        h.settle(); s.read()
        XCTAssertEqual(s.types, ["welcome"])
        s.session.receive(.text(Array(#"{"type":"sync","ref":"s1","cursor":100}"#.utf8)))
        h.publish("u", "during")
        h.settle(); s.read(); h.settle(); s.read()
        let ack = s.frames.firstIndex { $0["type"] == "ack" }!
        XCTAssertEqual(s.frames[ack]["ref"], "s1")
        let replay = changeSeqs(Array(s.frames[..<ack]))
        XCTAssertEqual(replay.first, 101)
        let all = changeSeqs(s.frames)
        XCTAssertEqual(Array(Set(all)).sorted(), Array(101...701), "the replay, and the change made meanwhile")
        XCTAssertEqual(all.last, 701)
    }
}
