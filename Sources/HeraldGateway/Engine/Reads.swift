import Foundation
import HeraldCore

/// Where reads that write nothing run (catch-up pages, history, counts): on
/// a reader thread with its own store connection when the store offers one
/// (SQLite in WAL mode serves readers beside its writer), so long reads
/// never hold up the engine's writes and deliveries (SQLite, and
/// PostgreSQL, whose partitions share one database and one reader); else
/// on the engine of the user's partition (the memory store, whose
/// partitions hold their users' feeds).
public final class Reads: Sendable {
    private let partitions: [Engine]
    private let reader: ReaderThread?

    init(partitions: [Engine], reader: ReaderThread?) {
        self.partitions = partitions
        self.reader = reader
    }

    func start() { reader?.start() }
    func stop() { reader?.stop() }

    /// Runs the queued reads on the calling thread (tests, whose gateway
    /// never starts the reader thread).
    public func runQueued() { reader?.runQueued() }

    /// Runs `body` (which reads `user`'s data) on one snapshot of the
    /// store, then `reply` on `shard`'s loop.
    func read<T: Sendable>(on shard: Shard, of user: UserKey, _ body: @escaping @Sendable (StoreReading) throws(StoreError) -> T,
                           reply: @escaping (Result<T, HeraldError>) -> Void) {
        read(on: shard, by: partitions.owner(of: user), body, reply: reply)
    }

    /// As `read`, for what is no one user's (an app's presence across
    /// nodes): read through the first partition, which does the store's
    /// store-wide work (`Engine.doesStoreWideWork`).
    func readStoreWide<T: Sendable>(on shard: Shard, _ body: @escaping @Sendable (StoreReading) throws(StoreError) -> T,
                                    reply: @escaping (Result<T, HeraldError>) -> Void) {
        read(on: shard, by: partitions[0], body, reply: reply)
    }

    private func read<T: Sendable>(on shard: Shard, by owner: Engine, _ body: @escaping @Sendable (StoreReading) throws(StoreError) -> T,
                                   reply: @escaping (Result<T, HeraldError>) -> Void) {
        guard let reader else {
            return owner.perform(on: shard, users: [], { e throws(StoreError) in try body(e.reads) }, reply: reply)
        }
        let reply = LoopBound(reply, owner: shard.thread)
        // A SQL store's reads: the owning partition's health, and its sync.
        let health = owner.health, syncer = owner.syncer
        reader.submit { r in
            let result: Result<T, HeraldError>
            do {
                result = .success(try r.read(body))
                health.succeeded(.read)
            } catch {
                health.failed(.read, "read", error)
                result = .failure(StoreHealth.unavailable)
            }
            // What the snapshot showed leaves only once it is on disk.
            syncer?.awaitVisibleCommits()
            shard.post { reply.value(result) }
        }
    }
}

/// One thread that owns a store's read-only connection and runs queued
/// reads in order: the devices' (`Reads`) and the engine's own routine
/// ones (`Engine.readAside`).
final class ReaderThread: @unchecked Sendable {  // `reader` is touched by `run` only; the queue is under `cond`
    private let reader: StoreReader
    private let cond = NSCondition()
    private var queue: [(StoreReader) -> Void] = []
    private var stopping = false
    private let finished = DispatchSemaphore(value: 0)
    private var started = false

    init(_ reader: StoreReader) { self.reader = reader }

    func start() {
        started = true
        let t = Thread { [self] in
            nameCurrentThread("herald-reader")
            run()
        }
        t.start()
    }

    func stop() {
        cond.lock()
        stopping = true
        cond.signal()
        cond.unlock()
        if started { finished.wait() }
    }

    func submit(_ job: @escaping @Sendable (StoreReader) -> Void) {
        cond.lock()
        queue.append(job)
        if queue.count == 1 { cond.signal() }
        cond.unlock()
    }

    func runQueued() {
        let jobs = cond.withLock { () -> [(StoreReader) -> Void] in defer { queue.removeAll() }; return queue }
        for j in jobs { j(reader) }
    }

    private func run() {
        while true {
            cond.lock()
            while queue.isEmpty && !stopping { cond.wait() }
            let jobs = queue
            queue.removeAll()
            let done = stopping && jobs.isEmpty
            cond.unlock()
            if done { break }
            for j in jobs { j(reader) }
        }
        finished.signal()
    }
}
