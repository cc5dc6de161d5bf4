import HeraldCore
import Observation

/// A client's state for SwiftUI (or any Observation user), on the main
/// actor: the local set, newest first, the badge and the connection, kept
/// from the client's `events`, so a view reads them without `await`.
///
/// ```swift
/// @State var model = HeraldModel(client: client)
/// List(model.notifications, id: \.id) { n in Text(n.payload["title"]?.stringValue ?? "") }
///     .badge(model.unread)
/// ```
@MainActor @Observable
public final class HeraldModel {
    public private(set) var notifications: [HeraldNotification] = []
    public private(set) var unread = 0
    /// The user's preferences (SPEC section 12), as every device shows them; nil until received.
    public private(set) var preferences: Preferences?
    public private(set) var connection: ConnectionState = .offline(nextRetry: nil)
    /// The last trouble the client handled (it retries by itself): for a status line.
    public private(set) var problem: HeraldClientError?

    @ObservationIgnored private var watcher: Task<Void, Never>?

    /// Follows `client` until `stop()` or until the model goes away. Its
    /// stream opens with the client's state as it is, so the model may be
    /// made before or after `start()`.
    public init(client: HeraldClient) {
        let events = client.events
        watcher = Task { [weak self] in
            for await event in events {
                guard let self else { return }
                self.apply(event)
            }
        }
    }

    isolated deinit { watcher?.cancel() }

    /// Stops following the client (the client itself runs on).
    public func stop() { watcher?.cancel() }

    func apply(_ event: HeraldClient.Event) {
        switch event {
        case .reset(let list):
            notifications = list
        case .upserted(let n):
            if let i = notifications.firstIndex(where: { $0.id == n.id }) { notifications.remove(at: i) }
            let at = notifications.firstIndex { n.comesBefore($0) } ?? notifications.endIndex
            notifications.insert(n, at: at)
        case .removed(let id, _):
            notifications.removeAll { $0.id == id }
        case .unread(let count):
            unread = count
        case .preferences(let p):
            preferences = p
        case .connection(let state):
            connection = state
        case .problem(let error):
            problem = error
        }
    }
}
