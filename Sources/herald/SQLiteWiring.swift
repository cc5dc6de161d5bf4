import HeraldCore
import HeraldGateway
import HeraldStores

func openSQLite(path: String, durability: String?) throws(UsageError) -> NotificationStore {
    var mode = SQLiteStore.Durability.full
    if let d = durability {
        guard let m = SQLiteStore.Durability(rawValue: d) else { throw UsageError("--durability must be full, normal or off") }
        mode = m
    }
    do { return try SQLiteStore(path: path, durability: mode, deferredSync: true, nameThread: nameCurrentThread) } catch {
        throw UsageError("--store sqlite:\(path): \(error.description)")
    }
}
