import HeraldCore

/// Which partition a user belongs to. A partition (one `Engine`) alone
/// writes its users' feeds, follows them and fans their changes out, so a
/// user's changes keep one order without any lock between partitions.
enum Partitioning {
    /// FNV-1a over the app id, a separator and the user id: stable for the
    /// process's life (the memory store's partitions hold their users'
    /// feeds), cheap per request, and spread evenly over the partitions.
    static func index(of user: UserKey, among count: Int) -> Int {
        guard count > 1 else { return 0 }
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        func mix(_ b: UInt8) { h = (h ^ UInt64(b)) &* 0x0000_0100_0000_01b3 }
        for b in user.app.utf8 { mix(b) }
        mix(0)
        for b in user.user.utf8 { mix(b) }
        return Int(h % UInt64(count))
    }

    /// `users` grouped by partition, each group in the order given.
    static func split(_ users: [UserKey], among count: Int) -> [Int: [UserKey]] {
        Dictionary(grouping: users) { index(of: $0, among: count) }
    }
}

extension Array where Element == Engine {
    /// The engine of `user`'s partition, among all the gateway's.
    func owner(of user: UserKey) -> Engine { self[Partitioning.index(of: user, among: count)] }
}
