import Foundation
import HeraldCore
import HeraldGateway
import HeraldPorts
import HeraldStores

/// `--store postgres://...`: a URL libpq cannot parse is a usage error
/// (exit 2); a server that cannot be reached or refuses us is not, and
/// exits 1 with one line, like any other failure to start.
/// `share`: the part of the feed cache's budget this store takes (one of a node's partitions).
func openPostgres(url: String, durability: String?, share: Int) throws(UsageError) -> NotificationStore {
    guard durability == nil else {
        throw UsageError("--durability applies to the sqlite store only (PostgreSQL's own settings decide durability)")
    }
    guard PostgresStore.describe(url: url) != nil else {
        throw UsageError("--store: not a valid PostgreSQL URL (postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?PARAM=VALUE...])")
    }
    do {
        let store = try PostgresStore(url: url, cacheBytes: PostgresStore.defaultCacheBytes / share)
        store.warn = { Log.warning("store: \($0)") }
        return store
    } catch {
        FileHandle.standardError.write("herald: --store \(error.description)\n".data(using: .utf8)!)
        exit(1)
    }
}
