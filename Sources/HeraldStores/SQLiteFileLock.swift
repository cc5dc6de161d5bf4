import Foundation
import HeraldCore

/// One gateway per SQLite file, enforced: an exclusive `flock` on
/// `PATH.lock` beside the database, held while the store is open. Each
/// gateway delivers live only what it commits itself, so a second one on the
/// file would acknowledge publishes that the first one's devices never hear.
/// The kernel lets the lock go when the process ends, however it ends, so a
/// restart right after `kill -9` takes it at once. (SQLite's own locks are
/// `fcntl` locks on the database and `-shm` files; this one is on a file of
/// its own, so neither can release or block the other.)
final class SQLiteFileLock {
    let path: String
    private var fd: Int32

    /// Takes the lock, or throws naming the file and, where it wrote it, the holder's pid.
    init(databasePath: String) throws(StoreError) {
        path = Self.canonical(databasePath) + ".lock"
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o644)  // never truncate what a link points at
        guard fd >= 0 else { throw StoreError("sqlite (\(databasePath)): cannot open the lock file \(path): \(Self.lastError)") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let busy = errno == EWOULDBLOCK
            let why = Self.lastError
            let holder = busy ? Self.holder(fd) : nil
            Foundation.close(fd)
            guard busy else { throw StoreError("sqlite (\(databasePath)): cannot lock \(path): \(why)") }
            throw StoreError("sqlite (\(databasePath)): another gateway\(holder.map { " (pid \($0))" } ?? "") has this database open; "
                             + "one gateway per file (its lock: \(path))")
        }
        // The holder's pid, for the message a second process prints.
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        _ = pid.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
    }

    func release() {
        guard fd >= 0 else { return }
        Foundation.close(fd)  // closing the only descriptor drops the lock
        fd = -1
    }

    deinit { release() }

    /// The file `path` names, through links (dangling ones too: the file may
    /// not exist yet) and `..`, so that every path to one file gives one lock
    /// (a hard link excepted: it is another name, not a link).
    static func canonical(_ path: String) -> String {
        var p = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        for _ in 0..<40 {  // the kernel's own bound on links followed
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: p) else { break }
            p = target.hasPrefix("/") ? target : (p as NSString).deletingLastPathComponent + "/" + target
        }
        let dir = (p as NSString).deletingLastPathComponent, name = (p as NSString).lastPathComponent
        guard let resolved = realpath(dir, nil) else { return p }
        defer { free(resolved) }
        let base = String(cString: resolved)
        return (base == "/" ? "" : base) + "/" + name
    }

    private static func holder(_ fd: Int32) -> Int32? {
        var buffer = [UInt8](repeating: 0, count: 16)
        let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard n > 0 else { return nil }
        return Int32(String(decoding: buffer[..<n], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
    }

    private static var lastError: String { String(cString: strerror(errno)) }
}
