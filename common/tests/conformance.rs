//! The embedded seams run the conformance suites every implementation must pass.

use std::sync::Arc;

use fleetrun_common::events::{Events, MemoryEvents};
use fleetrun_common::ledger::{JobRegistry, Ledger, MemoryLedger, MemoryRegistry};
use fleetrun_common::queue::{MemoryQueue, Queue};
use fleetrun_common::storage::{LocalStorage, Storage};

mod memory_queue {
    use super::*;
    fleetrun_common::queue_conformance!(|opts| async move {
        Arc::new(MemoryQueue::new(opts)) as Arc<dyn Queue>
    });
}

mod memory_events {
    use super::*;
    fleetrun_common::events_conformance!({
        let events = MemoryEvents::new();
        move || {
            let events = events.clone();
            async move { Arc::new(events) as Arc<dyn Events> }
        }
    });
}

mod memory_ledger {
    use super::*;
    fleetrun_common::ledger_conformance!(|| async {
        Arc::new(MemoryLedger::new()) as Arc<dyn Ledger>
    });
}

mod memory_registry {
    use super::*;
    fleetrun_common::registry_conformance!(|| async {
        Arc::new(MemoryRegistry::new()) as Arc<dyn JobRegistry>
    });
}

mod local_storage {
    use super::*;
    fleetrun_common::storage_conformance!(|| async {
        // Kept on purpose: the folder must outlive the storage handle the case owns.
        let dir = tempfile::tempdir().unwrap().keep();
        Arc::new(LocalStorage::new(dir)) as Arc<dyn Storage>
    });
}
