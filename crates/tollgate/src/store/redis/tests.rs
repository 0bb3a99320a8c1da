use super::*;
use crate::algorithm::LUA_IDS;

fn job(keys: &[&str]) -> Job {
    let (reply, _) = oneshot::channel();
    Job {
        decision: Encoded {
            keys: keys.iter().map(ToString::to_string).collect(),
            args: Vec::new(),
            reply_len: 2,
        },
        reply,
    }
}

#[test]
fn the_library_holds_every_algorithm_once_under_its_own_id() {
    let ids: std::collections::HashSet<u8> = LUA_IDS.iter().map(|&(_, id)| id).collect();
    assert_eq!(ids.len(), LUA_IDS.len(), "Lua ids repeat: {LUA_IDS:?}");
    for (name, id) in LUA_IDS {
        assert!(LIBRARY.contains(&format!("\nALGORITHMS[{id}] = {name}\n")), "{name}");
    }
    let registered = LIBRARY.lines().filter(|line| line.starts_with("ALGORITHMS[")).count();
    assert_eq!(registered, LUA_IDS.len());
}

#[test]
fn the_library_trims_as_many_ended_entries_a_call_as_the_engine() {
    let step = crate::algorithm::core::TRIM_STEP;
    assert!(
        LIBRARY.contains(&format!("\nlocal TRIM_STEP = {step}\n")),
        "TRIM_STEP {step}"
    );
}

#[test]
fn lanes_are_hash_slots_on_a_cluster_and_one_lane_elsewhere() {
    let spanning = ["t:{}:first", "t:{}:second"];
    assert_ne!(Slot::for_key(spanning[0]), Slot::for_key(spanning[1]));
    assert_eq!(lane_of(&job(&spanning), false), LaneKey::One);
    assert_eq!(lane_of(&job(&spanning), true), LaneKey::Alone);
    let a = lane_of(&job(&["t:{a}:x", "t:{a}:y"]), true);
    assert_eq!(a, LaneKey::Slot(Slot::for_key("a")));
    assert_eq!(lane_of(&job(&["t:{a}:z"]), true), a);
    assert_ne!(lane_of(&job(&["t:{b}:x"]), true), a);
}
