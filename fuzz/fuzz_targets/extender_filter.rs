//! `POST /filter` bodies (`ExtenderArgs`) from kube-scheduler or Cluster
//! Autoscaler: decoded or refused with a `BadRequest` (HTTP 400), never a
//! panic; each Node object of a dry run reads as a Node or is refused with
//! a `BadNode` naming it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use scheduler_webhook::extender::wire::decode_filter;

fuzz_target!(|data: &[u8]| {
    if let Ok(args) = decode_filter(data) {
        let names = args.candidates();
        match &args.nodes {
            Some(nodes) => {
                assert_eq!(names.len(), nodes.len());
                for object in nodes {
                    if let Err(bad) = object.node() {
                        assert_eq!(bad.name, object.name);
                    }
                }
            }
            None => assert_eq!(names.len(), args.node_names.as_ref().map_or(0, Vec::len)),
        }
    }
});
