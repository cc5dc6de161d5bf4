import HeraldCore
// The transport interface and the error type are HeraldClient's API too:
// `import HeraldClient` is all an app writes.
@_exported import HeraldClientTransport

/// A notification as the gateway sends it (SPEC section 1). Spelled
/// `HeraldNotification` because Foundation has a `Notification` too.
public typealias HeraldNotification = HeraldCore.Notification
public typealias ReadState = HeraldCore.ReadState
public typealias SeenState = HeraldCore.SeenState
public typealias UserActionState = HeraldCore.UserActionState
public typealias Platform = HeraldCore.Platform
/// Why a notification left this device: `deleted`, `expired`, or `hidden`
/// (retargeted away from it).
public typealias RemovalReason = HeraldCore.DeleteReason
/// The user's preferences (SPEC section 12): the same on every device.
public typealias Preferences = HeraldCore.Preferences
public typealias Channels = HeraldCore.Channels

public enum ConnectionState: Sendable, Equatable {
    case connecting
    /// Caught up and receiving live changes: `transport` is `websocket`, or
    /// `poll` while WebSocket upgrades are refused (held long-polls).
    case live(transport: String)
    /// Not connected; the next attempt is at `nextRetry` (nil: stopped).
    case offline(nextRetry: ContinuousClock.Instant?)
}

extension HeraldClient {
    public enum Event: Sendable, Equatable {
        /// A notification is new or changed on this device.
        case upserted(HeraldNotification)
        case removed(id: String, reason: RemovalReason)
        /// The whole local set was replaced (newest first): redraw everything.
        case reset([HeraldNotification])
        /// The gateway's unread count for this device.
        case unread(Int)
        /// The user's preferences, saved on any device or brought by a reset.
        case preferences(Preferences)
        case connection(ConnectionState)
        /// Something went wrong that the client handled (skipped a frame,
        /// will retry, stopped): for logs and diagnostics.
        case problem(HeraldClientError)
    }
}

extension HeraldNotification {
    /// Before `other` in the gateway's order: newest `createdAt` first, ties
    /// by higher `id` (byte order).
    func comesBefore(_ other: HeraldNotification) -> Bool {
        createdAt != other.createdAt ? createdAt > other.createdAt : other.id.utf8.lexicographicallyPrecedes(id.utf8)
    }
}

extension Array where Element == HeraldNotification {
    /// The gateway's order (`comesBefore`).
    func newestFirst() -> [HeraldNotification] { sorted { $0.comesBefore($1) } }
}
