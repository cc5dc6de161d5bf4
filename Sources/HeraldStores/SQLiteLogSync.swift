import Foundation
import HeraldCore

/// Syncs a SQLite store's write-ahead log for commits made at
/// `synchronous = NORMAL`, which write the log without syncing it: with
/// this `fdatasync` after them they are as durable as at `FULL`, but the
/// wait for the disk happens on the engine's sync thread, beside the next
/// batch, instead of inside `commit()` on the engine's.
///
/// The log is the file SQLite names for the connection (after symlinks),
/// opened when the store opens: it exists by then, as SQLite creates it at
/// the first read in WAL mode and keeps it while the store is open. Its
/// directory is synced once then, as SQLite does at its first sync of a new
/// log (and, like SQLite, a directory that cannot be synced is not an
/// error). Nothing here takes file locks (SQLite's are on the database file
/// and the `-shm` file), so closing the descriptor cannot drop SQLite's.
final class SQLiteLogSync: CommitSync {
    let path: String
    private let fd: Int32

    init(logPath: String) throws(StoreError) {
        path = logPath
        fd = open(logPath, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw Self.failure("open", logPath) }
        let dir = open(URL(fileURLWithPath: logPath).deletingLastPathComponent().path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dir >= 0 {
            _ = fsync(dir)
            Foundation.close(dir)
        }
    }

    deinit { Foundation.close(fd) }

    func sync() throws(StoreError) {
        guard fdatasync(fd) == 0 else { throw Self.failure("fdatasync", path) }
    }

    private static func failure(_ what: String, _ path: String) -> StoreError {
        StoreError("sqlite: cannot \(what) \(path): \(String(cString: strerror(errno)))")
    }
}
