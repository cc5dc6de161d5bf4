import HeraldCore

/// With a bus: the net under `Engine.deviceChanged`. A device event carries
/// no seq, so one that never came (its node killed between commit and
/// publish, or dropped from a publisher's full queue) shows nowhere: a
/// device deleted on another node would stay connected here (SPEC 4 says
/// 4003), or keep filtering by its old platform and tags, until it
/// reconnects. Every `every`, the registrations of the devices connected
/// here are read on the store's reader thread (`Engine.readAside`; 500 users
/// a statement on PostgreSQL) and their connections told, as an event
/// would: a read that differs from what a connection has (or says the
/// device is gone) has the engine read that registration again
/// (`Engine.deviceChanged`) and tell its connections, so a read older than
/// a change the connection already took never undoes it. Engine thread
/// only.
final class DeviceAudit {
    static let every: Millis = 30_000

    private var next: Millis = 0
    /// A read is out on the reader thread.
    private var reading = false

    /// `now`: a tick (`Clock.ticks`).
    func run(_ e: Engine, tick now: Millis) {
        guard now >= next, !reading else { return }
        next = now + Self.every
        let connected = e.followedDevices
        guard !connected.isEmpty else { return }
        reading = true
        let users = Array(connected.keys)
        e.readAside({ r throws(StoreError) in try r.devices(of: users) }) { e, stored in
            e.maintenance.devices.reading = false
            switch stored {
            case .success(let stored):
                e.forEach(stored, of: connected) { shards, user, id, device in
                    guard let device else { return e.deviceChanged(user, deviceId: id) }
                    let v = Viewer(userId: user.user, device: device)
                    for s in shards { s.post { s.checkViewer(user, deviceId: id, read: v) } }
                }
            case .failure(let error): e.health.failed(.read, "device audit", error)
            }
        }
    }
}
