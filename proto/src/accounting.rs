//! How one pod's containers add up: **app containers add up, init
//! containers count at their peak**, and the pod holds the larger of the
//! two in every dimension.
//!
//! Init containers run one at a time and finish before the app containers
//! start, so at no moment does a pod use more than its largest init
//! container, or all its app containers together. Kubernetes charges quotas
//! this way (the "effective request"), HAMi's scheduler counts a GPU's slots,
//! memory and cores this way, and the node must count them exactly as the
//! scheduler does, or it refuses what the scheduler placed. This module is
//! that rule, once:
//!
//! - the scheduler's ledger (`scheduler-webhook` `core::reservation`), per
//!   GPU, over each container's slice of that GPU;
//! - the scheduler's quota book (`core::quota`), per namespace, over each
//!   container's total;
//! - the node's `SliceLedger` (`node-daemon` `ledger`), per GPU, over each
//!   container's slice.
//!
//! Each caller brings its own amount type (what the dimensions are, and
//! their widths) by implementing [`Amount`]. Pure: no I/O.

/// A quantity with several dimensions (slots, memory, cores …) that can be
/// added and compared dimension by dimension.
pub trait Amount: Copy + Default {
    /// Both amounts together, dimension by dimension (saturating: an
    /// overflowing sum is clamped, never wrapped).
    #[must_use]
    fn plus(self, other: Self) -> Self;

    /// The larger of the two in every dimension.
    #[must_use]
    fn peak(self, other: Self) -> Self;
}

/// Which kind of container an amount belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// An init container: runs alone, before the app containers.
    Init,
    /// An app container: runs beside the others.
    App,
}

impl Role {
    /// The role of the container at `index` when the first `init_count`
    /// containers are init containers (HAMi's order: init first).
    #[must_use]
    pub fn of_index(index: usize, init_count: usize) -> Self {
        if index < init_count {
            Self::Init
        } else {
            Self::App
        }
    }
}

/// One pod's containers, added one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodAmount<A> {
    init_peak: A,
    app_sum: A,
}

impl<A: Amount> PodAmount<A> {
    /// Adds one container's amount.
    pub fn add(&mut self, role: Role, amount: A) {
        match role {
            Role::Init => self.init_peak = self.init_peak.peak(amount),
            Role::App => self.app_sum = self.app_sum.plus(amount),
        }
    }

    /// The app containers' sum alone.
    #[must_use]
    pub fn app(&self) -> A {
        self.app_sum
    }

    /// What the pod holds: the init peak or the app sum, whichever is larger
    /// in each dimension.
    #[must_use]
    pub fn total(&self) -> A {
        self.init_peak.peak(self.app_sum)
    }
}

impl<A: Amount> FromIterator<(Role, A)> for PodAmount<A> {
    fn from_iter<I: IntoIterator<Item = (Role, A)>>(iter: I) -> Self {
        let mut pod = Self::default();
        for (role, amount) in iter {
            pod.add(role, amount);
        }
        pod
    }
}

/// What a pod holds, given each container's role and amount.
#[must_use]
pub fn pod_total<A: Amount>(containers: impl IntoIterator<Item = (Role, A)>) -> A {
    containers.into_iter().collect::<PodAmount<A>>().total()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Two dimensions of different widths, as the callers have.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    struct Use {
        slots: u32,
        mib: u64,
    }

    impl Amount for Use {
        fn plus(self, o: Self) -> Self {
            Self {
                slots: self.slots.saturating_add(o.slots),
                mib: self.mib.saturating_add(o.mib),
            }
        }
        fn peak(self, o: Self) -> Self {
            Self {
                slots: self.slots.max(o.slots),
                mib: self.mib.max(o.mib),
            }
        }
    }

    fn u(slots: u32, mib: u64) -> Use {
        Use { slots, mib }
    }

    #[test]
    fn app_containers_add_up_and_init_containers_count_at_their_peak() {
        let total = pod_total([
            (Role::Init, u(1, 800)),
            (Role::Init, u(1, 600)),
            (Role::App, u(1, 300)),
            (Role::App, u(1, 200)),
        ]);
        // Slots: app 2 > init 1; memory: init 800 > app 500.
        assert_eq!(total, u(2, 800));
    }

    #[test]
    fn a_pod_without_containers_holds_nothing() {
        assert_eq!(pod_total::<Use>([]), Use::default());
    }

    #[test]
    fn roles_follow_hami_order_init_first() {
        assert_eq!(Role::of_index(0, 2), Role::Init);
        assert_eq!(Role::of_index(1, 2), Role::Init);
        assert_eq!(Role::of_index(2, 2), Role::App);
        assert_eq!(Role::of_index(0, 0), Role::App);
    }

    fn container() -> impl Strategy<Value = (Role, Use)> {
        (any::<bool>(), 0u32..4, 0u64..10_000).prop_map(|(init, slots, mib)| {
            (if init { Role::Init } else { Role::App }, u(slots, mib))
        })
    }

    proptest! {
        /// The rule against its plain statement: per dimension, the max of
        /// (the sum over app containers, the max over init containers).
        #[test]
        fn total_is_max_of_app_sum_and_init_peak(pod in proptest::collection::vec(container(), 0..12)) {
            let app = pod.iter().filter(|(r, _)| *r == Role::App);
            let init = pod.iter().filter(|(r, _)| *r == Role::Init);
            let app_slots: u32 = app.clone().map(|(_, a)| a.slots).sum();
            let app_mib: u64 = app.map(|(_, a)| a.mib).sum();
            let init_slots = init.clone().map(|(_, a)| a.slots).max().unwrap_or(0);
            let init_mib = init.map(|(_, a)| a.mib).max().unwrap_or(0);
            prop_assert_eq!(
                pod_total(pod.iter().copied()),
                u(app_slots.max(init_slots), app_mib.max(init_mib))
            );
        }

        /// The order the containers are added in does not matter.
        #[test]
        fn order_does_not_matter(pod in proptest::collection::vec(container(), 0..12), seed in any::<u64>()) {
            let mut shuffled = pod.clone();
            // A deterministic Fisher-Yates from the seed.
            let mut s = seed;
            for i in (1..shuffled.len()).rev() {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                let j = usize::try_from(s >> 33).unwrap_or(0) % (i + 1);
                shuffled.swap(i, j);
            }
            prop_assert_eq!(pod_total(pod), pod_total(shuffled));
        }

        /// A pod holds at least each of its containers, and adding a
        /// container never makes it hold less.
        #[test]
        fn total_covers_every_container_and_only_grows(
            pod in proptest::collection::vec(container(), 0..12),
            extra in container(),
        ) {
            let total = pod_total(pod.iter().copied());
            for (_, a) in &pod {
                prop_assert!(total.slots >= a.slots && total.mib >= a.mib);
            }
            let more = pod_total(pod.iter().copied().chain([extra]));
            prop_assert!(more.slots >= total.slots && more.mib >= total.mib);
        }

        /// An init container no larger than what the app containers hold
        /// together changes nothing: it runs before them, in the same room.
        #[test]
        fn a_small_init_container_is_free(
            app in proptest::collection::vec((0u32..4, 0u64..10_000), 1..6),
            pick in any::<prop::sample::Index>(),
        ) {
            let pod: Vec<(Role, Use)> = app.iter().map(|&(s, m)| (Role::App, u(s, m))).collect();
            let (s, m) = app[pick.index(app.len())];
            let with_init = pod.iter().copied().chain([(Role::Init, u(s, m))]);
            prop_assert_eq!(pod_total(pod.iter().copied()), pod_total(with_init));
        }
    }
}
