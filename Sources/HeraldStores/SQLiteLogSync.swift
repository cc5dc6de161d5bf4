import Foundation
import HeraldCore

/// Syncs a SQLite store's write-ahead log for commits made at
/// `synchronous = NORMAL`, which write the log without syncing it: with
/// this `fdatasync` after them they are as durable as at `FULL`, but the
/// wait for the disk happens on the engine's sync thread, beside the next
/// batch, instead of inside `commit()` on the engine's.
///
/// The log is opened by name on first use (SQLite creates it at the first
/// write and keeps it while the store is open); the file's directory is
/// synced then too, as SQLite does at its first sync of a new log, so that
/// the log itself survives a power cut. Nothing here takes file locks, so
/// closing the descriptor cannot drop SQLite's.
final class SQLiteLogSync: CommitSync, @unchecked Sendable {  // `fd` is used by one thread at a time (CommitSync's contract)
    let path: String
    private var fd: Int32 = -1

    init(databasePath: String) { path = databasePath + "-wal" }

    deinit { if fd >= 0 { Foundation.close(fd) } }

    func sync() throws(StoreError) {
        if fd < 0 {
            fd = open(path, O_RDONLY | O_CLOEXEC)
            // No log yet: nothing was written, so nothing waits on the disk.
            if fd < 0 && errno == ENOENT { return }
            guard fd >= 0 else { throw failure("open") }
            try syncDirectory()
        }
        guard fdatasync(fd) == 0 else { throw failure("fdatasync") }
    }

    private func syncDirectory() throws(StoreError) {
        let dir = open(URL(fileURLWithPath: path).deletingLastPathComponent().path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dir >= 0 else { throw failure("open the directory of") }
        defer { Foundation.close(dir) }
        guard fsync(dir) == 0 else { throw failure("fsync the directory of") }
    }

    private func failure(_ what: String) -> StoreError {
        StoreError("sqlite: cannot \(what) \(path): \(String(cString: strerror(errno)))")
    }
}
