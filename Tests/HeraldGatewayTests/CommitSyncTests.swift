import XCTest
import Foundation
import HeraldCore
@testable import HeraldGateway

/// The engine with a store whose commits become durable through a sync on
/// the engine's sync thread (SQLite at full durability): nothing leaves
/// before that sync, and commands that arrive during it join the next
/// commit.
final class CommitSyncTests: XCTestCase {
    let store = FailingStore()
    let disk = GatedSync()
    var h: Harness!
    var syncer: CommitSyncer!
    var engineStarted = false

    /// `reader`: reads run on the reader's queue (the test runs it), not the engine.
    func makeGateway(reader: Bool = false) throws {
        store.commitSync = disk
        store.offersReader = reader
        h = Harness(store: store)
        syncer = try XCTUnwrap(h.gateway.soleEngine.syncer)
    }

    override func tearDown() {
        disk.open()
        if engineStarted { h?.gateway.soleEngine.stop() } else { syncer?.stop() }
        super.tearDown()
    }

    let alice = UserKey(app: Harness.app.id, user: "alice")

    /// The engine on its own thread, as in the gateway; the test drains the loop.
    func startEngine() {
        engineStarted = true
        h.gateway.soleEngine.start()
    }

    /// The engine on the test's thread (`Harness.settle`), the syncs on the sync thread.
    func startSyncsOnly() { h.gateway.soleEngine.startSyncThread() }

    /// Runs the loop until `done` holds (the engine works on its thread).
    func drain(until done: () -> Bool, _ what: String) {
        let deadline = Date().addingTimeInterval(30)
        while !done() && Date() < deadline {
            if h.loop.drain() == 0 { usleep(200) }
        }
        XCTAssertTrue(done(), what)
    }

    /// `Harness.settle` with the engine on the test's thread, waiting for
    /// every commit's sync before running its effects.
    func settle() {
        repeat {
            h.gateway.soleEngine.runQueued()
            syncer.awaitVisibleCommits()
            h.gateway.soleEngine.runQueued()
            h.gateway.reads.runQueued()
        } while h.loop.drain() > 0
    }

    func testRepliesWaitForTheSyncAndWhatArrivesMeanwhileJoinsOneCommit() throws {
        try makeGateway()
        startEngine()
        let ws = h.webSocket()
        h.hello(ws, user: "alice")
        drain(until: { ws.read(); return ws.types.contains("welcome") }, "welcome")
        let before = store.commits.load(ordering: .relaxed)

        disk.close()
        let first = h.publish("alice", "a1")
        drain(until: { store.upserts.load(ordering: .relaxed) == 1 && store.commits.load(ordering: .relaxed) > before },
              "the first publish committed")
        let committed = store.commits.load(ordering: .relaxed)
        // Its sync is held: the next two publishes run, and wait to commit.
        let second = h.publish("alice", "a2")
        let third = h.publish("alice", "a3")
        drain(until: { store.upserts.load(ordering: .relaxed) == 3 }, "the next publishes ran")
        XCTAssertEqual(store.commits.load(ordering: .relaxed), committed, "committed beside a sync under way")
        h.loop.drain()
        ws.read()
        XCTAssertNil(first.response, "answered before its commit was synced")
        XCTAssertEqual(changeSeqs(ws.frames), [], "delivered before its commit was synced")

        disk.open()
        drain(until: { third.response != nil }, "all answered")
        XCTAssertEqual([first, second, third].map { $0.response?.status }, [201, 201, 201])
        XCTAssertEqual(store.commits.load(ordering: .relaxed), committed + 1, "the two that waited share one commit")
        drain(until: { ws.read(); return changeSeqs(ws.frames).count == 3 }, "three changes")
        XCTAssertEqual(changeSeqs(ws.frames), [1, 2, 3], "each change once, in commit order")
    }

    func testAReadThatSawAnUnsyncedCommitWaitsForItsSync() throws {
        try makeGateway(reader: true)
        startSyncsOnly()
        publishSettled("a1")
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
        try makeGateway()
        startSyncsOnly()
        publishSettled("a1")
        disk.close()
        let first = h.publish("alice", "a2")
        h.runEngine()
        store.failCommits = 1
        let failed = h.publish("alice", "a3")
        // The failed batch waits for the earlier one's sync: let it finish
        // once the batch ran (the engine then waits for the sync thread's wake-up).
        let ran = UpsertCount(store: store)
        Thread { [disk] in
            while ran.value < 3 { usleep(100) }
            disk.open()
        }.start()
        let replies = h.loop.capture { h.runEngine() }
        XCTAssertEqual(replies.count, 2)
        replies.first?()
        XCTAssertEqual(first.response?.status, 201, "the earlier batch is answered first")
        XCTAssertNil(failed.response)
        replies.last?()
        XCTAssertEqual(failed.response?.status, 503)
        XCTAssertEqual(try store.feed(alice).head, 2)
    }

    /// One notification for alice, published and acknowledged.
    func publishSettled(_ anid: String) {
        let r = h.publish("alice", anid)
        settle()
        XCTAssertEqual(r.response?.status, 201)
    }
}

/// The store's upsert count, read on another thread.
private struct UpsertCount: @unchecked Sendable {  // reads only the store's atomic counter
    let store: FailingStore
    var value: Int { store.upserts.load(ordering: .relaxed) }
}
