import XCTest
import Foundation
import HeraldCore
@testable import HeraldGateway

/// The engine with a store whose commits become durable through a sync on
/// the engine's sync thread (SQLite at full durability): nothing leaves
/// before that sync, and the engine runs the next batch meanwhile.
final class CommitSyncTests: XCTestCase {
    let store = FailingStore()
    let disk = GatedSync()
    var h: Harness!
    var syncer: CommitSyncer!

    override func setUpWithError() throws {
        store.commitSync = disk
        store.offersReader = true
        h = Harness(store: store)
        syncer = try XCTUnwrap(h.gateway.engine.syncer)
        syncer.start {}
    }

    override func tearDown() {
        disk.open()
        syncer.stop()
        super.tearDown()
    }

    let alice = UserKey(app: Harness.app.id, user: "alice")

    /// `Harness.settle`, waiting for every commit's sync before running its effects.
    func settle() {
        repeat {
            h.gateway.engine.runQueued()
            syncer.awaitVisibleCommits()
            h.gateway.engine.runQueued()
            h.gateway.reads.runQueued()
        } while h.loop.drain() > 0
    }

    func testRepliesAndDeliveriesWaitForTheSyncWhileTheNextBatchRuns() throws {
        let ws = h.webSocket()
        h.hello(ws, user: "alice")
        settle()
        ws.read()
        XCTAssertEqual(ws.types, ["reset", "welcome"])

        disk.close()
        let first = h.publish("alice", "a1")
        h.runEngine()
        XCTAssertEqual(try store.feed(alice).head, 1, "committed")
        h.loop.drain()
        ws.read()
        XCTAssertNil(first.response, "answered before its commit was synced")
        XCTAssertEqual(changeSeqs(ws.frames), [], "delivered before its commit was synced")

        // The first sync is still under way: the next batch commits beside it.
        let second = h.publish("alice", "a2")
        h.runEngine()
        XCTAssertEqual(try store.feed(alice).head, 2, "the next batch waited for the sync")
        h.loop.drain()
        XCTAssertNil(second.response)

        disk.open()
        settle()
        ws.read()
        XCTAssertEqual(first.response?.status, 201)
        XCTAssertEqual(second.response?.status, 201)
        XCTAssertEqual(changeSeqs(ws.frames), [1, 2], "each change once, in commit order")
    }

    func testAReadThatSawAnUnsyncedCommitWaitsForItsSync() throws {
        h.publishSettledDurably(self)
        disk.close()
        h.publish("alice", "a2")
        h.runEngine()
        let history = h.request("GET", "/v1/me/notifications", token: h.token("alice"))
        // The reader thread's part, on a thread of its own: it may block.
        let done = DispatchSemaphore(value: 0)
        let reads = h.gateway.reads
        Thread { reads.runQueued(); done.signal() }.start()
        let deadline = Date().addingTimeInterval(30)
        var returned = false
        while syncer.waiting == 0 && Date() < deadline {
            if done.wait(timeout: .now() + .milliseconds(1)) == .success { returned = true; break }
        }
        XCTAssertFalse(returned, "the read's answer left before the commit it saw was synced")
        XCTAssertEqual(syncer.waiting, 1)
        h.loop.drain()
        XCTAssertNil(history.response)

        disk.open()
        if !returned { done.wait() }
        h.loop.drain()
        XCTAssertEqual(history.response?.status, 200)
        XCTAssertEqual(history.json?["notifications"]?.arrayValue?.count, 2)
    }

    func testAFailedCommitIsAnsweredAfterTheBatchesBeforeIt() throws {
        h.publishSettledDurably(self)
        disk.close()
        let first = h.publish("alice", "a2")
        h.runEngine()
        store.failCommits = 1
        let failed = h.publish("alice", "a3")
        // The failure waits for the earlier batch's sync: let it finish.
        Thread { [disk] in disk.open() }.start()
        let replies = h.loop.capture { h.runEngine() }
        XCTAssertEqual(replies.count, 2)
        replies.first?()
        XCTAssertEqual(first.response?.status, 201, "the earlier batch is answered first")
        XCTAssertNil(failed.response)
        replies.last?()
        XCTAssertEqual(failed.response?.status, 503)
        XCTAssertEqual(try store.feed(alice).head, 2)
    }
}

private extension Harness {
    /// One notification for alice, published and acknowledged.
    func publishSettledDurably(_ t: CommitSyncTests) {
        let r = publish("alice", "a1")
        t.settle()
        XCTAssertEqual(r.response?.status, 201)
    }
}
