import Foundation
import HeraldCore
import HeraldPorts

/// Makes the engine's commits durable on a thread of its own, for stores
/// whose `commit()` leaves that to a `CommitSync` (SQLite at full
/// durability): the engine runs the next batch while the disk syncs the
/// last, and one sync covers every commit that returned before it began.
///
/// Commits are numbered by generation. The engine raises `committing`
/// before each commit and asks for a sync after it (`request`), and runs a
/// batch's effects (replies, deliveries) once `synced` reached its
/// generation. A reader that may have seen a commit waits for the same
/// (`awaitVisibleCommits`): nothing that a power cut could still take back
/// leaves the gateway, through a reply or a read.
final class CommitSyncer: @unchecked Sendable {  // every var is under `cond`
    private let sync: CommitSync
    private let cond = NSCondition()
    /// The last generation whose commit began; a snapshot taken now sees at most its commits.
    private var committing: UInt64 = 0
    private var requested: UInt64 = 0
    private var synced: UInt64 = 0
    private var stopping = false
    private var thread: Thread?
    /// Threads blocked in `wait`.
    private var waiters = 0
    private let finished = DispatchSemaphore(value: 0)
    init(_ sync: CommitSync) { self.sync = sync }

    /// Starts the sync thread; `advanced` runs on it after each sync (it
    /// wakes the engine).
    func start(advanced: @escaping @Sendable () -> Void) {
        let t = Thread { [self] in
            nameCurrentThread("herald-sync")
            run(advanced)
        }
        cond.withLock { thread = t }
        t.start()
    }

    /// Engine thread, right before a commit: its generation.
    func beginCommit() -> UInt64 {
        cond.withLock {
            committing += 1
            return committing
        }
    }

    /// Engine thread, after the commit of `generation` returned or failed.
    func request(_ generation: UInt64) {
        cond.withLock {
            requested = max(requested, generation)
            cond.broadcast()
        }
    }

    var syncedGeneration: UInt64 { cond.withLock { synced } }
    /// No sync is under way or asked for.
    var isIdle: Bool { cond.withLock { synced >= requested } }
    /// Whether syncs run on the thread (else `wait` runs them).
    var isThreaded: Bool { cond.withLock { thread != nil } }
    /// Threads blocked until a sync (for tests).
    var waiting: Int { cond.withLock { waiters } }

    /// Blocks until every commit up to `generation` is durable. Without the
    /// thread (tests that drive the engine on their own), syncs here.
    func wait(for generation: UInt64) {
        cond.lock()
        defer { cond.unlock() }
        guard thread != nil else {
            if synced < generation { syncNow(upTo: max(generation, requested)) }
            return
        }
        waiters += 1
        while synced < generation { cond.wait() }
        waiters -= 1
    }

    /// After a read: blocks until every commit the read could have seen is
    /// durable.
    func awaitVisibleCommits() {
        wait(for: cond.withLock { committing })
    }

    /// Syncs what was requested and stops the thread.
    func stop() {
        cond.lock()
        stopping = true
        cond.broadcast()
        let started = thread != nil
        cond.unlock()
        if started { finished.wait() }
    }

    private func run(_ advanced: @Sendable () -> Void) {
        cond.lock()
        while true {
            while requested <= synced && !stopping { cond.wait() }
            if requested <= synced { break }
            let target = requested
            cond.unlock()
            syncOrDie()
            cond.lock()
            synced = target
            cond.broadcast()
            cond.unlock()
            advanced()
            cond.lock()
        }
        cond.unlock()
        finished.signal()
    }

    /// Under `cond` (tests' inline path).
    private func syncNow(upTo target: UInt64) {
        syncOrDie()
        synced = target
    }

    /// A failed sync means the disk may have dropped writes that the store
    /// already shows to later transactions; retrying cannot tell (Linux may
    /// mark the failed pages clean). Like PostgreSQL since 2018, stop rather
    /// than acknowledge: whatever was acknowledged before is on disk, and a
    /// restart reads the store from what the disk really holds.
    private func syncOrDie() {
        do {
            try sync.sync()
        } catch {
            Log.error("store: \(error); stopping so that nothing unsynced is acknowledged")
            fatalError("store sync failed: \(error)")
        }
    }
}
