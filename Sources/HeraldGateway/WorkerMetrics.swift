import Foundation
import HeraldCore
import HeraldPorts

/// `herald serve --workers N`: a scrape through the shared port reaches
/// whichever worker the kernel hands the connection to. So each worker also
/// writes its metrics, every second, to a folder its supervisor made
/// (`worker-<i>.prom`, replaced whole by a rename), and `/metrics` on any
/// worker answers every worker's as last written, each sample labelled
/// `worker="<i>"`. All come from the files, its own too, so a counter never
/// goes back between two scrapes that two workers answered. A file not
/// rewritten for `staleAfter` (its worker died) is left out until the
/// worker is back.
public final class WorkerMetrics: Sendable {
    let folder: String
    let index: Int
    static let staleAfter: TimeInterval = 5
    /// Set by `remove`; a write holds the lock, so none follows `remove`.
    private let stopped = Locked(false)

    public init(folder: String, index: Int) { self.folder = folder; self.index = index }

    /// Writes `metrics` now and then every second, on a thread of its own,
    /// until `remove`.
    public func startWriting(_ metrics: Metrics) {
        let own = file(index), temporary = own + ".tmp"
        Thread { [self] in
            nameCurrentThread("herald-metrics")
            var failing = false
            while true {
                // A failed write leaves the last file, which turns stale.
                let written = stopped.withLock { stopped -> Bool? in
                    if stopped { return nil }
                    return FileManager.default.createFile(atPath: temporary, contents: Data(metrics.prometheusText().utf8))
                        && rename(temporary, own) == 0
                }
                guard let written else { return }
                if !written && !failing { Log.warning("metrics: cannot write \(own) for the other workers' /metrics: \(String(cString: strerror(errno)))") }
                failing = !written
                Thread.sleep(forTimeInterval: 1)
            }
        }.start()
    }

    /// At exit: this worker's files go, and the folder with the last
    /// worker's (also when the supervisor was killed and cannot).
    public func remove() {
        stopped.withLock { stopped in
            stopped = true
            unlink(file(index))
            unlink(file(index) + ".tmp")
        }
        rmdir(folder)
    }

    /// `/metrics`: every live worker's, `own` (this worker's now) standing
    /// in for its file until that is first written.
    func text(own: String) -> String {
        var texts: [(Int, String)] = []
        let now = Date()
        for name in (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? [] {
            guard name.hasPrefix("worker-"), let i = Int(name.dropFirst("worker-".count).dropLast(".prom".count)),
                  name == "worker-\(i).prom",
                  let written = (try? FileManager.default.attributesOfItem(atPath: file(i)))?[.modificationDate] as? Date,
                  abs(now.timeIntervalSince(written)) < Self.staleAfter,  // abs: the clock may step back
                  let data = FileManager.default.contents(atPath: file(i)) else { continue }
            texts.append((i, String(decoding: data, as: UTF8.self)))
        }
        if !texts.contains(where: { $0.0 == index }) { texts.append((index, own)) }
        return Self.merge(texts.sorted { $0.0 < $1.0 })
    }

    private func file(_ i: Int) -> String { "\(folder)/worker-\(i).prom" }

    /// Prometheus texts of several workers as one: each family once (its
    /// `# HELP` and `# TYPE` lines from the first worker that has it), with
    /// every worker's samples, each labelled with its worker.
    static func merge(_ workers: [(index: Int, text: String)]) -> String {
        var families: [String] = [], lines: [String: [String]] = [:], headers = Set<Substring>()
        for (index, text) in workers {
            var family = ""
            for line in text.split(separator: "\n") {
                if line.hasPrefix("#") {
                    let words = line.split(separator: " ", maxSplits: 3)
                    if words.count >= 3 { family = String(words[2]) }
                    if lines[family] == nil { families.append(family); lines[family] = [] }
                    if headers.insert(line).inserted { lines[family]!.append(String(line)) }
                } else {
                    if lines[family] == nil { families.append(family); lines[family] = [] }
                    lines[family]!.append(labelled(line, worker: index))
                }
            }
        }
        return families.map { lines[$0]!.joined(separator: "\n") + "\n" }.joined()
    }

    /// `name{a="b"} v` → `name{worker="i",a="b"} v`; `name v` → `name{worker="i"} v`.
    static func labelled(_ sample: Substring, worker: Int) -> String {
        let label = "worker=\"\(worker)\""
        let nameEnd = sample.firstIndex { $0 == "{" || $0 == " " } ?? sample.endIndex
        guard nameEnd < sample.endIndex, sample[nameEnd] == "{" else {
            return "\(sample[..<nameEnd]){\(label)}\(sample[nameEnd...])"
        }
        let rest = sample[sample.index(after: nameEnd)...]
        return "\(sample[...nameEnd])\(label)\(rest.hasPrefix("}") ? "" : ",")\(rest)"
    }
}
