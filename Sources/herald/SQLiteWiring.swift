import HeraldCore
import HeraldGateway
import HeraldPorts
import HeraldStores

/// The `partitions` of the SQLite store at `path`, a file each
/// (`SQLitePartitionFiles`), users moved between them first if the files
/// on disk were laid out for another count. Without `partitions`, as many
/// as the files are laid out for, or one for a new store: on the benchmark
/// machine two files held no more publishes than one, and at full
/// durability their two logs synced more often (docs/BENCHMARKS.md,
/// "Durable publishes on SQLite").
func openSQLite(path: String, durability: String?, partitions: Int?) throws(UsageError) -> [NotificationStore] {
    var mode = SQLiteStore.Durability.full
    if let d = durability {
        guard let m = SQLiteStore.Durability(rawValue: d) else { throw UsageError("--durability must be full, normal or off") }
        mode = m
    }
    do throws(StoreError) {
        return try SQLitePartitionFiles.open(base: path, count: partitions, log: { Log.info($0) }) { p throws(StoreError) in
            try SQLiteStore(path: p, durability: mode, deferredSync: true, nameThread: nameCurrentThread)
        }
    } catch {
        throw UsageError("--store sqlite:\(path): \(error.description)")
    }
}
