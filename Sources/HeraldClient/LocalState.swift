import HeraldCore

/// The device's copy of its feed, kept by the rules of PROTOCOL.md 5.6:
/// changes applied once each in arrival order (a `seq` at or below the
/// cursor is a duplicate), frame cursors adopted, resets applied whole.
struct LocalState {
    var notifications: [String: HeraldNotification] = [:]
    var cursor: Int64?
    var epoch: String?
    /// The user's preferences (SPEC section 12), once a reset or a save brought them.
    var preferences: Preferences?
    /// The `reset` frames received so far: applied together at the final one,
    /// never half.
    private var staged: [HeraldNotification]?

    /// What one frame did: the events to report and what to persist.
    struct Applied {
        var events: [HeraldClient.Event] = []
        /// Ids whose stored row must be rewritten (or removed when gone).
        var changedIds: Set<String> = []
        var replaced = false
        var positionMoved = false
        /// The gateway's feed has another epoch than the one held: its
        /// history was lost, and its registrations may have gone with it.
        var epochReplaced = false
        var preferencesChanged = false
        var needsSave: Bool { replaced || positionMoved || preferencesChanged || !changedIds.isEmpty }
    }

    init() {}

    init(notifications: [String: HeraldNotification], cursor: Int64?, epoch: String?, preferences: Preferences?) {
        self.notifications = notifications; self.cursor = cursor; self.epoch = epoch; self.preferences = preferences
    }

    /// Applies the feed part of a frame; other frames change nothing here.
    mutating func apply(_ frame: ServerFrame) -> Applied {
        var out = Applied()
        let heldEpoch = epoch
        switch frame {
        case .changes(let changes, let frameCursor):
            for change in changes where cursor.map({ change.seq > $0 }) ?? true {
                switch change.op {
                case .upsert(let n):
                    notifications[n.id] = n
                    out.changedIds.insert(n.id)
                    out.events.append(.upserted(n))
                case .delete(let id, _, let reason):
                    if notifications.removeValue(forKey: id) != nil {
                        out.changedIds.insert(id)
                        out.events.append(.removed(id: id, reason: reason))
                    }
                case .preferences(let p) where p.version > preferences?.version ?? -1:
                    adopt(p, into: &out)
                case .preferences:
                    break
                }
                cursor = change.seq
                out.positionMoved = true
            }
            if let frameCursor { out.positionMoved = adopt(cursor: frameCursor, epoch: nil) || out.positionMoved }
        case .reset(let page, let resetCursor, let resetEpoch, let final, let resetPreferences):
            staged = (staged ?? []) + page
            guard final, let all = staged else { break }
            if let resetPreferences { adopt(resetPreferences, into: &out) }
            staged = nil
            notifications = Dictionary(all.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
            cursor = resetCursor
            epoch = resetEpoch
            out.replaced = true
            out.events.append(.reset(sorted))
        case .welcome(let welcomeCursor, let welcomeEpoch, _):
            staged = nil
            out.positionMoved = adopt(cursor: welcomeCursor, epoch: welcomeEpoch)
        case .counts, .answer, .error, .tokenExpiring, .unknown:
            break
        }
        out.epochReplaced = heldEpoch != nil && epoch != heldEpoch
        return out
    }

    /// Takes `p`: a reset's whole (a feed that lost its history starts
    /// again at version 0), a change's only when newer than what is held
    /// (a reset's preferences may be read after its cursor, so a save they
    /// hold can follow them).
    private mutating func adopt(_ p: Preferences, into out: inout Applied) {
        guard p != preferences else { return }
        preferences = p
        out.preferencesChanged = true
        out.events.append(.preferences(p))
    }

    /// A connection ended: a reset it left unfinished is dropped.
    mutating func connectionEnded() { staged = nil }

    /// Rule 3 of PROTOCOL.md 5.6: `cursor = max(cursor, frame's)`, epoch taken.
    private mutating func adopt(cursor frameCursor: Int64, epoch frameEpoch: String?) -> Bool {
        let before = (cursor, epoch)
        cursor = max(cursor ?? frameCursor, frameCursor)
        if let frameEpoch { epoch = frameEpoch }
        return before != (cursor, epoch)
    }

    var sorted: [HeraldNotification] { Array(notifications.values).newestFirst() }

    /// Computed from the local set; the gateway's own count comes in `counts`.
    var unread: Int { notifications.values.count { $0.readState == .unread } }
}
