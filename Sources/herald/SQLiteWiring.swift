import HeraldCore
import HeraldStores

/// Until the SQLite store lands, `sqlite:` falls back to refusing clearly.
func openSQLite(path: String, durability: String?) throws(UsageError) -> NotificationStore {
    throw UsageError("--store sqlite:\(path): the SQLite store is not available in this build yet; use --store memory")
}
