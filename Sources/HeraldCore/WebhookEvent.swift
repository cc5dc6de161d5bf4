/// Who made a change (SPEC section 13, `data.deviceId`), recorded with the
/// write (`FeedTransaction`): the events it gives depend on it.
public enum ChangeActor: Sendable, Equatable {
    /// The app's servers (server key).
    case app
    /// A device's request; nil for a device token naming no device.
    case device(String?)
    /// Herald itself: an expiry, a dead push handle removed.
    case herald
    /// Herald waking a snoozed notification (SPEC section 11): the change
    /// gives `notification.woke` alone, whatever states it reset.
    case wake

    /// `data.deviceId`: only a device's request names one.
    public var deviceId: String? {
        if case .device(let id) = self { return id }
        return nil
    }
}

/// The event types of SPEC section 13.
public enum WebhookEventType: String, Sendable, CaseIterable {
    case created = "notification.created", replaced = "notification.replaced"
    case read = "notification.read", unread = "notification.unread", seen = "notification.seen"
    case activated = "notification.activated", dismissed = "notification.dismissed", snoozed = "notification.snoozed"
    case woke = "notification.woke", deleted = "notification.deleted"
    case preferencesUpdated = "preferences.updated", pushUnregistered = "push.unregistered"
}

/// One webhook event: its type, and its `data` (SPEC section 13). Pure:
/// derived from what a write did, encoded once into the body every
/// endpoint and every retry sends.
public struct WebhookEvent: Sendable, Equatable {
    public let type: WebhookEventType
    /// When the change happened (the body's `timestamp`).
    public let at: Millis
    /// `data` but its `notification`, which is written from its own bytes.
    public let data: JSONObject
    /// `data.notification`, for the events that carry one.
    public let notification: Notification?

    public init(_ type: WebhookEventType, at: Millis, data: JSONObject, notification: Notification? = nil) {
        self.type = type; self.at = at; self.data = data; self.notification = notification
    }

    /// The body: `{"type", "timestamp", "data"}`, written straight to
    /// bytes (the notification's as every change writes it: no JSON tree).
    public var body: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(1024)
        out += #"{"type":"#.utf8
        JSON.encodeString(type.rawValue, into: &out)
        out += #","timestamp":""#.utf8
        RFC3339.append(at, to: &out)
        out += #"","data":"#.utf8
        JSON.object(data).encode(into: &out)
        if let notification {
            out.removeLast()  // data's closing brace: it always holds appId and the rest
            out += #","notification":"#.utf8
            notification.encode(into: &out)
            out.append(UInt8(ascii: "}"))
        }
        out.append(UInt8(ascii: "}"))
        return out
    }

    private static func common(_ user: UserKey, seq: Int64?, by actor: ChangeActor) -> JSONObject {
        ["appId": .string(user.app), "userId": .string(user.user), "seq": seq.map(JSON.int) ?? .null,
         "deviceId": actor.deviceId.map(JSON.string) ?? .null]
    }

    /// The types of the events a change gives: `previous` is the
    /// notification before it (nil for a new one), `published` whether the
    /// app published it. One per state the change moved, in the order
    /// read/unread, seen, then the user action; none for a change that
    /// moved nothing an event names (`userActionState` back to
    /// `noInteraction`, a `hidden` delete, which is no stored change).
    public static func types(_ change: Change, previous: Notification?, published: Bool, by actor: ChangeActor) -> [WebhookEventType] {
        switch change.op {
        case .delete(_, _, let reason):
            return reason == .hidden ? [] : [.deleted]
        case .preferences:
            return [.preferencesUpdated]
        case .upsert(let n):
            if actor == .wake { return [.woke] }
            guard let p = previous, !published else { return [previous == nil ? .created : .replaced] }
            var types: [WebhookEventType] = []
            if p.readState != n.readState { types.append(n.readState == .read ? .read : .unread) }
            if p.seenState != n.seenState, n.seenState == .seen { types.append(.seen) }
            if p.userActionState != n.userActionState {
                switch n.userActionState {
                case .activated: types.append(.activated)
                case .dismissed: types.append(.dismissed)
                case .snoozed: types.append(.snoozed)
                case .noInteraction: break
                }
            }
            return types
        }
    }

    /// The events of `types` for a change of `user`'s feed, which all share
    /// its data (built once: a notification's JSON is the dearest part).
    public static func events(_ user: UserKey, _ change: Change, at: Millis, types: [WebhookEventType],
                              by actor: ChangeActor) -> [WebhookEvent] {
        guard !types.isEmpty else { return [] }
        var data = common(user, seq: change.seq, by: actor)
        var notification: Notification? = nil
        switch change.op {
        case .delete(let id, let anid, let reason):
            data["id"] = .string(id); data["appNotificationId"] = .string(anid); data["reason"] = .string(reason.rawValue)
        case .upsert(let n):
            notification = n
        case .preferences(let p):
            // As the answers show them, `critical` as the config was at the save.
            data["preferences"] = p.json
        }
        return types.map { WebhookEvent($0, at: at, data: data, notification: notification) }
    }

    /// `push.unregistered`: Herald removed `device`'s dead handle of
    /// `service`; `device` as the devices listing shows it. No change of
    /// the feed, so `seq` is null; Herald acted.
    public static func pushUnregistered(_ user: UserKey, device: JSON, service: PushService, at: Millis) -> WebhookEvent {
        var data = common(user, seq: nil, by: .herald)
        data["device"] = device
        data["service"] = .string(service.rawValue)
        return WebhookEvent(.pushUnregistered, at: at, data: data)
    }
}
