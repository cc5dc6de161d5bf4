// TEMPORARY until the stores branch lands: counts by a history scan, no reader.
extension StoreReading {
    public func counts(_ user: UserKey) throws(StoreError) -> [TargetingCounts] {
        var out: [TargetingCounts] = []
        var after: HistoryKey? = nil
        while true {
            let page = try history(user, after: after, limit: 1000)
            for n in page {
                let i = out.firstIndex { $0.targeting == n.targeting } ?? { out.append(TargetingCounts(targeting: n.targeting)); return out.count - 1 }()
                out[i].total += 1
                if n.readState == .unread { out[i].unread += 1 }
                if n.userActionState == .noInteraction { out[i].noInteraction += 1 }
            }
            guard page.count == 1000, let last = page.last else { return out }
            after = HistoryKey(last)
        }
    }
}

extension NotificationStore {
    public func makeReader() throws(StoreError) -> StoreReader? { nil }
}
