/// One of the partitions of a gateway's users. A partition (one engine)
/// alone writes its users' feeds, follows them and fans their changes out,
/// so a user's changes keep one order without any lock between partitions.
public struct Partition: Sendable, Equatable {
    public let index: Int
    public let count: Int

    public init(index: Int, count: Int) {
        precondition(count >= 1 && (0..<count).contains(index), "partition \(index) of \(count)")
        self.index = index; self.count = count
    }

    /// All users, in one partition.
    public static let whole = Partition(index: 0, count: 1)

    public func owns(_ user: UserKey) -> Bool { count < 2 || Self.index(of: user, among: count) == index }

    /// Which of `count` partitions `user` belongs to: 32-bit FNV-1a over the
    /// app id, a zero byte and the user id, modulo `count`. Cheap per
    /// request, spread evenly, and computed the same by the PostgreSQL
    /// function `herald_partition` (`PostgresSchema`), so a store several
    /// partitions share can select one partition's rows.
    public static func index(of user: UserKey, among count: Int) -> Int {
        guard count > 1 else { return 0 }
        var h: UInt32 = 2_166_136_261
        func mix(_ b: UInt8) { h = (h ^ UInt32(b)) &* 16_777_619 }
        for b in user.app.utf8 { mix(b) }
        mix(0)
        for b in user.user.utf8 { mix(b) }
        return Int(h % UInt32(count))
    }

    /// `users` grouped by partition, each group in the order given.
    public static func split(_ users: [UserKey], among count: Int) -> [Int: [UserKey]] {
        Dictionary(grouping: users) { index(of: $0, among: count) }
    }
}
