import HeraldCore
import HeraldGateway
import HeraldPorts
import HeraldStores

/// The `count` partitions of the SQLite store at `path`, a file each
/// (`SQLitePartitionFiles`), users moved between them first if the files
/// on disk were laid out for another count.
func openSQLite(path: String, durability: String?, partitions count: Int) throws(UsageError) -> [NotificationStore] {
    var mode = SQLiteStore.Durability.full
    if let d = durability {
        guard let m = SQLiteStore.Durability(rawValue: d) else { throw UsageError("--durability must be full, normal or off") }
        mode = m
    }
    do throws(StoreError) {
        return try SQLitePartitionFiles.open(base: path, count: count, log: { Log.info($0) }) { p throws(StoreError) in
            try SQLiteStore(path: p, durability: mode, deferredSync: true, nameThread: nameCurrentThread)
        }
    } catch {
        throw UsageError("--store sqlite:\(path): \(error.description)")
    }
}
