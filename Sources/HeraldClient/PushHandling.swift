import Foundation
import HeraldCore

/// A push handle this device registers with the gateway (PROTOCOL.md 15.1).
public enum PushRegistration: Sendable, Equatable {
    public enum APNsEnvironment: String, Sendable { case production, development }

    /// The device token `didRegisterForRemoteNotificationsWithDeviceToken` gives.
    case apns(token: Data, environment: APNsEnvironment)
    /// The registration token FCM gives (`onNewToken`).
    case fcm(token: String)

    var json: JSON {
        var o = JSONObject()
        switch self {
        case .apns(let token, let environment):
            o["service"] = "apns"
            o["token"] = .string(token.map { String(format: "%02x", $0) }.joined())
            o["environment"] = .string(environment.rawValue)
        case .fcm(let token):
            o["service"] = "fcm"
            o["token"] = .string(token)
        }
        return .object(o)
    }
}

/// What a Herald push carries (PROTOCOL.md 15.3), read from what the app is
/// handed: APNs' `userInfo` (a `herald` dictionary beside `aps`) or FCM's
/// `data` (the same names, flat, as strings). A value, so that it can go to
/// the client from whichever thread the system called the app on.
public struct ReceivedPush: Sendable, Equatable {
    /// The change behind the push: a sync from the stored cursor reaches it.
    public var cursor: Int64
    public var epoch: String
    public var notificationId: String?
    /// `upsert`, `state` or `delete`.
    public var op: String

    /// nil when the payload is not Herald's (another SDK's push, say).
    public init?(userInfo: [AnyHashable: Any]) {
        if let herald = userInfo["herald"] as? [AnyHashable: Any] {
            self.init(fields: herald)
        } else if let kind = userInfo["kind"] as? String, kind == "alert" || kind == "tap" {
            self.init(fields: userInfo)
        } else {
            return nil
        }
    }

    private init?(fields: [AnyHashable: Any]) {
        guard let cursor = Self.integer(fields["cursor"]), let epoch = fields["epoch"] as? String,
              let op = fields["op"] as? String, ["upsert", "state", "delete"].contains(op) else { return nil }
        self.cursor = cursor
        self.epoch = epoch
        self.op = op
        notificationId = fields["id"] as? String
    }

    /// A JSON number as the platform hands it over, or FCM's string.
    private static func integer(_ value: Any?) -> Int64? {
        switch value {
        case let n as Int64: n
        case let n as Int: Int64(n)
        case let n as NSNumber: n.int64Value
        case let s as String: Int64(s)
        default: nil
        }
    }
}

/// What `syncOnce` (and so `handlePush`) did.
public struct PushSync: Sendable, Equatable {
    /// The changes it applied, as `events` tells them.
    public var changes: [HeraldClient.Event]
    /// Notifications to take out of the system's tray: dismissed, read,
    /// deleted, expired or hidden by what it applied. On Apple platforms pass
    /// them to `removeDeliveredNotifications(withIdentifiers:)`: the gateway's
    /// alerts use the notification id as their collapse id.
    public var trayRemovals: [String]
}

extension HeraldClient {
    /// Registers this device's push handle, once: the same handle again
    /// (each app launch hands it over) sends nothing.
    public func registerPush(_ handle: PushRegistration) async throws(HeraldClientError) {
        let sent = handle.json.encodedString
        // The token first: it says whose the state file is, which may forget a former owner's handle.
        _ = try await validToken()
        guard sent != registeredPush else { return }
        try await sendPush(handle.json, as: sent)
    }

    func sendPush(_ handle: JSON, as sent: String) async throws(HeraldClientError) {
        try await withAPI { api, token throws(HeraldClientError) in try await api.registerPush(token: token, push: handle) }
        try rememberPush(sent)
    }

    /// Takes this device's push handle off its registration (sign-out, or
    /// the user turned notifications off).
    public func removePush() async throws(HeraldClientError) {
        try await withAPI { api, token throws(HeraldClientError) in try await api.registerPush(token: token, push: .null) }
        try rememberPush(nil)
    }

    /// Brings the local set up to date for a push (`ReceivedPush(userInfo:)`),
    /// over HTTP, within `limit` (iOS gives a background push about 30 s).
    /// A push the local set already covers (late, or repeated) asks nothing.
    public func handlePush(_ push: ReceivedPush, within limit: Duration = .seconds(25)) async throws(HeraldClientError) -> PushSync {
        if push.epoch == state.epoch, let cursor = state.cursor, cursor >= push.cursor, shown {
            return PushSync(changes: [], trayRemovals: [])
        }
        return try await syncOnce(within: limit)
    }

    /// Syncs from the stored cursor over HTTP, or pages a reset when the
    /// epoch changed, and applies what comes under the same rules as the
    /// WebSocket; answers what changed and what to take out of the tray.
    /// For a push, or for an app that wants to catch up without connecting.
    public func syncOnce(within limit: Duration = .seconds(25)) async throws(HeraldClientError) -> PushSync {
        let deadline = ContinuousClock.now + limit
        // The token first: it decides whose the stored set is, and so what "before" holds.
        _ = try await validToken()
        let me = nextCollector
        nextCollector += 1
        collectors[me] = []
        defer { collectors[me] = nil }
        let before = state.notifications
        var more = true
        while more {
            let left = deadline - .now
            guard left > .zero else { throw .unreachable("the sync did not finish within \(limit)") }
            let (cursor, epoch) = (state.cursor, state.epoch)
            let answer = try await withAPI { api, token throws(HeraldClientError) in
                try await api.sync(token: token, cursor: cursor, epoch: epoch, wait: .zero, timeout: left)
            }
            more = try await apply(answer)
        }
        return PushSync(changes: collectors[me] ?? [], trayRemovals: Self.trayRemovals(before: before, after: state.notifications))
    }

    /// Gone since, or read or dismissed since: out of the tray.
    static func trayRemovals(before: [String: HeraldNotification], after: [String: HeraldNotification]) -> [String] {
        let handled = { (n: HeraldNotification) in n.readState == .read || n.userActionState == .dismissed }
        var out = before.keys.filter { after[$0] == nil }
        for (id, n) in after where handled(n) && !(before[id].map(handled) ?? false) { out.append(id) }
        return out.sorted()
    }
}
