import Foundation
import HeraldCore

/// Where reads that write nothing run (catch-up pages, history, counts): on
/// a reader thread with its own store connection when the store offers one
/// (SQLite in WAL mode serves readers beside its writer), so long reads
/// never hold up the engine's writes and deliveries (a reader per SQLite
/// file, one per partition; one for PostgreSQL, whose partitions share one
/// database); else on the engine of the user's partition (the memory
/// store, whose partitions hold their users' feeds).
public final class Reads: Sendable {
    private let partitions: [Engine]
    /// By partition: its reader thread (a shared store's one for all), or nil.
    private let readers: [ReaderThread?]

    init(partitions: [Engine], readers: [ReaderThread?]) {
        self.partitions = partitions
        self.readers = readers
    }

    private var threads: [ReaderThread] {
        var seen: [ReaderThread] = []
        for case let r? in readers where !seen.contains(where: { $0 === r }) { seen.append(r) }
        return seen
    }

    func start() { for r in threads { r.start() } }
    func stop() { for r in threads { r.stop() } }

    /// Runs the queued reads on the calling thread (tests, whose gateway
    /// never starts the reader threads).
    public func runQueued() { for r in threads { r.runQueued() } }

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
        guard let reader = readers[owner.partition] else {
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
    private let name: String
    private let cond = NSCondition()
    private var queue: [(StoreReader) -> Void] = []
    private var stopping = false
    private let finished = DispatchSemaphore(value: 0)
    private var started = false

    init(_ reader: StoreReader, name: String = "herald-reader") { self.reader = reader; self.name = name }

    /// By partition: the reader of each store of its own (`herald-reader-P`
    /// when there are several), or of a store the partitions share (all of
    /// them the first's); nil where the store has no reader connection.
    static func forEach(of stores: [NotificationStore]) throws(StoreError) -> [ReaderThread?] {
        if stores[0].isShared || stores.count == 1 {
            let one = try stores[0].makeReader().map { ReaderThread($0) }
            return stores.map { _ in one }
        }
        var readers: [ReaderThread?] = []
        for (i, s) in stores.enumerated() { readers.append(try s.makeReader().map { ReaderThread($0, name: "herald-reader-\(i)") }) }
        return readers
    }

    func start() {
        started = true
        let t = Thread { [self] in
            nameCurrentThread(name)
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
