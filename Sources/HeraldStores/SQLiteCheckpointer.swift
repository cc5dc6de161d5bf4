import CSQLite
import Foundation
import HeraldCore
import Synchronization

/// Copies the write-ahead log into the database file on a thread and a
/// connection of its own, so that copying a large log never stalls the
/// engine's commits.
///
/// Run inside a commit (SQLite's automatic checkpoint), copying a 64 MiB log
/// held every publish of that batch, and of those queued behind it, for
/// tens of milliseconds: durable publishes at 4,000/s had a p99 of 130–180 ms.
///
/// The engine's connection reports each commit (a WAL hook). Every `step`
/// new pages (a quarter of `pages`) this thread copies what is in the log
/// (a passive checkpoint, which waits on no one) and syncs the file. Small
/// passes, because one pass per full log wrote in a burst that held the
/// commits' own syncs on the same disk for up to 75 ms. The thread syncs
/// the file itself because SQLite does so after a pass only if no commit
/// came in meanwhile, which under load is never: the commit that started
/// the log over then synced every page copied since, 30-100 ms.
///
/// The log starts over from its top only once it was copied whole, so once
/// it holds `pages` pages the next commit after a pass copies the little
/// that came in since, on the engine's connection; its next transaction
/// then starts the log over. If this thread falls behind (a reader holding
/// an old snapshot), commits past twice `pages` copy what they can
/// themselves, as SQLite would.
final class SQLiteCheckpointer: @unchecked Sendable {  // `phase`, `passedAt` and `stopping` are under `cond`; `db` is used on the checkpoint thread only
    private enum Phase { case idle, copying, copied }

    let pages: Int32
    /// New pages in the log between two passes.
    let step: Int32
    /// Pages in the log when the last pass began (what it copied).
    private var passedAt: Int32 = 0
    private let db: SQLiteDatabase
    /// Whether a pass ends with a sync of the file (not when durability is off).
    private let syncs: Bool
    private let cond = NSCondition()
    private var phase = Phase.idle
    private var stopping = false
    private let finished = DispatchSemaphore(value: 0)
    /// Passes run on this thread, and the pages in the log after the last
    /// commit (for tests).
    let completed = Atomic<Int>(0)
    let logPages = Atomic<Int32>(0)

    init(path: String, durability: SQLiteStore.Durability, pages: Int32,
         nameThread: @escaping @Sendable (String) -> Void) throws(StoreError) {
        self.pages = pages
        step = max(1, pages / 4)
        db = try SQLiteDatabase(path: path)
        do throws(StoreError) {
            // A checkpoint syncs the log and the file as this connection's
            // `synchronous` says: the store's durability.
            try db.execute("PRAGMA synchronous = \(durability.rawValue.uppercased())")
        } catch {
            db.close()
            throw error
        }
        syncs = durability != .off
        Thread { [self] in
            nameThread("herald-checkpt")
            run()
        }.start()
    }

    /// After a commit on the writer's connection `writer` (engine thread):
    /// the log holds `frames` pages.
    fileprivate func committed(frames: Int32, writer: OpaquePointer?, schema: UnsafePointer<CChar>?) {
        logPages.store(frames, ordering: .relaxed)
        cond.lock()
        // A log that started over counts from its top again.
        if frames < passedAt { passedAt = 0 }
        var finish = false
        if phase == .copied {
            phase = .idle
            finish = frames >= pages
            if finish { passedAt = 0 }
        }
        if phase == .idle && !finish && frames >= passedAt + step {
            phase = .copying
            cond.signal()
        }
        cond.unlock()
        if finish || frames >= 2 * pages {
            sqlite3_wal_checkpoint_v2(writer, schema, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
        }
    }

    /// Makes the writer's `db` report its commits here.
    func watch(_ writer: SQLiteDatabase) {
        writer.onCommit(Unmanaged.passUnretained(self).toOpaque(), sqliteWALHook)
    }

    /// Stops the thread and closes its connection; `writer` no longer
    /// reports here (it must be the one `watch` was given).
    func stop(_ writer: SQLiteDatabase) {
        writer.onCommit(nil, nil)
        cond.lock()
        stopping = true
        cond.signal()
        cond.unlock()
        finished.wait()
    }

    private func run() {
        while true {
            cond.lock()
            while phase != .copying && !stopping { cond.wait() }
            let stop = stopping
            cond.unlock()
            if stop { break }
            let log = db.checkpoint()
            // A failed sync is left to the commit that starts the log over,
            // whose own sync must succeed before the log is reused.
            if syncs { _ = db.syncFile() }
            completed.add(1, ordering: .relaxed)
            cond.lock()
            if let log { passedAt = log }
            phase = .copied
            cond.unlock()
        }
        db.close()
        finished.signal()
    }
}

private func sqliteWALHook(_ context: UnsafeMutableRawPointer?, _ db: OpaquePointer?,
                           _ schema: UnsafePointer<CChar>?, _ frames: Int32) -> Int32 {
    guard let context else { return SQLITE_OK }
    Unmanaged<SQLiteCheckpointer>.fromOpaque(context).takeUnretainedValue().committed(frames: frames, writer: db, schema: schema)
    return SQLITE_OK
}
