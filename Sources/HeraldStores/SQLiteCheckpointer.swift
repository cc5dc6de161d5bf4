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
/// One cycle: the engine's connection reports each commit (a WAL hook).
/// Once the log holds `pages` pages this thread copies it (a passive
/// checkpoint, which waits on no one). The log keeps growing meanwhile, and
/// only starts over from the top once it was copied whole, so the next
/// commit after that pass copies the little that came in during it, on the
/// engine's connection; its next transaction then starts the log over. If
/// this thread falls behind (a reader holding an old snapshot), commits past
/// twice `pages` copy what they can themselves, as SQLite would.
final class SQLiteCheckpointer: @unchecked Sendable {  // `phase` and `stopping` are under `cond`; `db` is used on the checkpoint thread only
    private enum Phase { case idle, copying, copied }

    let pages: Int32
    private let db: SQLiteDatabase
    private let cond = NSCondition()
    private var phase = Phase.idle
    private var stopping = false
    private let finished = DispatchSemaphore(value: 0)
    /// Passes run on this thread, and the pages in the log after the last
    /// commit (for tests).
    let completed = Atomic<Int>(0)
    let logPages = Atomic<Int32>(0)

    init(path: String, durability: SQLiteStore.Durability, pages: Int32) throws(StoreError) {
        self.pages = pages
        db = try SQLiteDatabase(path: path)
        do throws(StoreError) {
            // A checkpoint syncs the log and the file as this connection's
            // `synchronous` says: the store's durability.
            try db.execute("PRAGMA synchronous = \(durability.rawValue.uppercased())")
        } catch {
            db.close()
            throw error
        }
        Thread { [self] in run() }.start()
    }

    /// After a commit on the writer's connection `writer` (engine thread):
    /// the log holds `frames` pages.
    fileprivate func committed(frames: Int32, writer: OpaquePointer?, schema: UnsafePointer<CChar>?) {
        logPages.store(frames, ordering: .relaxed)
        cond.lock()
        var finish = false
        switch phase {
        case .idle where frames >= pages:
            phase = .copying
            cond.signal()
        case .idle, .copying:
            break
        case .copied:
            finish = true
            phase = .idle
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
            _ = db.checkpoint()
            completed.add(1, ordering: .relaxed)
            cond.lock()
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
