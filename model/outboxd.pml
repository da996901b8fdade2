/*
 * outboxd's delivery protocol as a Promela model, checked with spin.
 *
 * What it models: ingest appending events to streams (one delivery per
 * routed sink, a head per (sink, stream)); claims of due heads and the run
 * behind them, with a lease token, a lease that may expire, and the
 * attempt counted at claim; the sink's outcome per event; the fenced
 * finish of the whole batch in one transaction (delivered / retry / dead,
 * with on-dead move-on or block, release of the untried rest of a
 * stream); lease expiry and takeover; a worker crashing at any step; an
 * operator replaying a dead letter; two sinks, the second chained after
 * the first (`after`). README.md maps every step to the code in host/src.
 *
 * Bounds (set with -D, see check.sh): NS streams (<= 2), NE events per
 * stream (<= 3), NW workers (<= 3), MAXCRASH crashes, MAXSLOW leases that
 * run out under a live worker, MAXATT attempts before the retry window is
 * used up, REPLAYS operator replays, BLOCK_A (sink A's on-dead = block).
 *
 * Mutants (each must yield a counterexample):
 *   NO_FENCE        finish ignores the lease token
 *   NO_HEAD_CHECK   claim takes any pending delivery, not only the head
 *   NO_AFTER_CHECK  the chained sink ignores its `after` sink
 *   NO_HEAD_LOCK    finish moves/drops a head in two steps that an ingest
 *                   of the same stream can run between (PostgreSQL without
 *                   the head row locks of finish and ingest)
 *   NO_BLOCK_HEAD_CHECK a blocking dead letter takes the head even when an
 *                   earlier delivery of its stream is still undelivered
 */

#ifndef NS
#define NS 2
#endif
#ifndef NE
#define NE 2
#endif
#ifndef NW
#define NW 2
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXSLOW
#define MAXSLOW 1
#endif
#ifndef MAXATT
#define MAXATT 2
#endif
#ifndef REPLAYS
#define REPLAYS 1
#endif
#ifndef BLOCK_A
#define BLOCK_A 0
#endif

#define NSINK 2          /* sink 0 = A; sink 1 = B, chained after A */
#define MAXNS 2
#define MAXNE 3
#define MAXD  12         /* NSINK * MAXNS * MAXNE */
#define NONE  255

/* delivery of (sink s, stream k, sequence i); head slot of (s, k) */
#define D(s,k,i) ((s)*6 + (k)*3 + (i))
#define H(s,k)   ((s)*2 + (k))

/* delivery status, as deliveries.status */
#define ABSENT    0
#define PENDING   1
#define DELIVERED 2
#define DEAD      3

/* outcome of one event of a batch, as Finish */
#define O_DELIVERED 1
#define O_RETRY     2
#define O_DEAD      3
#define O_RELEASE   4

#define ONDEAD_BLOCKS(s) ((s) == 0 && BLOCK_A)

/* ---- the store ---- */
byte st[MAXD];           /* status */
byte tok[MAXD];          /* lease_token: 0 = NULL, else the claiming worker */
bool live[MAXD];         /* lease_expires_at > now() */
byte att[MAXD];          /* attempts */
byte head[4];            /* heads.delivery_id as a sequence, NONE = no row */
bool hblk[4];            /* heads.due_at = never (blocking dead letter) */
byte ingested[MAXNS];    /* streams.last_sequence */

/* ---- ghosts: what the targets saw, and who holds each lease ---- */
bool got[MAXD];          /* the target has received this event */
bool wasdead[MAXD];      /* dead-lettered at some point */
byte owner[MAXD];        /* the worker of the latest claim */
byte bat[8];             /* bat[2w], bat[2w+1]: worker w's batch (delivery ids) */
byte crashes, slows, replays;

/* ---- properties checked as assertions ---- */

/* No order violation, at the target: the target of sink s receives
   (k, i) only after every earlier event of stream k reached it, or had
   been dead-lettered with on-dead = move-on (a replay later does not undo
   that the stream moved on). */
inline order_ok(s, k, i) {
  j = 0;
  do
  :: j < i ->
     assert(got[D(s,k,j)] || (wasdead[D(s,k,j)] && !ONDEAD_BLOCKS(s)));  /* prop: order */
     j++
  :: else -> break
  od
}

/* No order violation, at the handover: a claim hands (k, i) over only
   when every earlier event of stream k is delivered, or dead with
   on-dead = move-on, or is `sk` (the head of the same batch, handed
   over just before it). */
inline handover_ok(s, k, i, sk) {
  j = 0;
  do
  :: j < i ->
     assert(j == sk || st[D(s,k,j)] == DELIVERED || (st[D(s,k,j)] == DEAD && !ONDEAD_BLOCKS(s)));  /* prop: order */
     j++
  :: else -> break
  od;
  j = 0
}

/* The chained sink's target receives an event only after its `after`
   sink delivered it. */
#define CHAIN_OK(s,k,i) ((s) == 0 || st[D(0,k,i)] == DELIVERED)

/* ---- ingest (Store::ingest): one transaction ---- */
inline ingest(k) {
  i = ingested[k];
  s = 0;
  do
  :: s < NSINK ->
     st[D(s,k,i)] = PENDING;
     /* INSERT INTO heads ... ON CONFLICT (sink, stream) DO NOTHING */
     if
     :: head[H(s,k)] == NONE -> head[H(s,k)] = i
     :: else -> skip
     fi;
     s++
  :: else -> break
  od;
  ingested[k]++;
  i = 0; s = 0
}

/* ---- claim (Store::claim_after) ---- */

/* May (s, k, i) be claimed as a head? Due (no live lease, not blocked),
   pending, at the head of its stream, and for the chained sink its event
   delivered by the `after` sink. */
#ifdef NO_HEAD_CHECK
#define AT_HEAD(s,k,i) (head[H(s,k)] != NONE)
#else
#define AT_HEAD(s,k,i) (head[H(s,k)] == i)
#endif
#ifdef NO_AFTER_CHECK
#define AFTER_OK(s,k,i) true
#else
#define AFTER_OK(s,k,i) ((s) == 0 || st[D(0,k,i)] != PENDING && st[D(0,k,i)] != DEAD)
#endif
#define ELIG(s,k,i) (k < NS && i < ingested[k] && AT_HEAD(s,k,i) && !hblk[H(s,k)] \
                     && st[D(s,k,i)] == PENDING && !live[D(s,k,i)] && AFTER_OK(s,k,i))
/* May (s, k, i+1) follow (s, k, i) in the same batch (the contiguous run
   behind a head: pending, due, not leased; cut at a held-back chain). */
#define FOLLOWS(s,k,i) (i + 1 < ingested[k] && st[D(s,k,i+1)] == PENDING \
                        && !live[D(s,k,i+1)] && AFTER_OK(s,k,i+1))

inline lease(c) {
  tok[c] = w; live[c] = 1; att[c]++; owner[c] = w
}

inline claim(s0, k0, i0) {
  bs = s0; bk = k0; bi = i0;
  h = D(s0,k0,i0); lease(h); ah = att[h];
  handover_ok(s0, k0, i0, NONE);
  assert(CHAIN_OK(s0, k0, i0));  /* prop: chain */
  f = NONE;
  if
  :: FOLLOWS(s0,k0,i0) ->
     f = D(s0,k0,i0+1); lease(f); af = att[f];
     handover_ok(s0, k0, i0+1, i0);
     assert(CHAIN_OK(s0, k0, i0+1))  /* prop: chain */
  :: true -> skip
  fi;
  bat[2*w] = h; bat[2*w+1] = f
}

/* ---- the sink call (plugin deliver) and the retry policy ---- */

/* retry::after_failure: another attempt unless the window is used up. */
inline failure(a, o) {
  if
  :: a >= MAXATT -> o = O_DEAD
  :: else -> o = O_RETRY
  fi
}

inline outcome(s, k, i, c, a, o) {
  if
  :: /* the target takes it */
     order_ok(s, k, i);
     assert(CHAIN_OK(s, k, i));  /* prop: chain */
     got[c] = 1; o = O_DELIVERED; j = 0
  :: failure(a, o)          /* retry(..), or a trap of the whole batch */
  :: o = O_DEAD             /* reject(..) */
  fi
}

/* ---- finish (Store::finish_many): one fenced transaction ---- */

/* First pending sequence of (s, k), or NONE. */
inline first_pending(s, k, r) {
  r = 0;
  do
  :: r < ingested[k] && st[D(s,k,r)] != PENDING -> r++
  :: r < ingested[k] && st[D(s,k,r)] == PENDING -> break
  :: r >= ingested[k] -> r = NONE; break
  od
}

#ifdef NO_FENCE
#define FENCED(c) (st[c] == PENDING)
#else
#define FENCED(c) (tok[c] == w && st[c] == PENDING)
#endif

/* One kept-or-dropped finish of delivery c = (s, k, i) with outcome o.
   `del` is set when the head must be dropped in a second step. */
inline fin(s, k, i, c, o, del) {
  if
  :: FENCED(c) ->
     /* at most one worker's effects per lease */
     assert(owner[c] == w);  /* prop: fence */
     tok[c] = 0; live[c] = 0;
     if
     :: o == O_DELIVERED || (o == O_DEAD && !ONDEAD_BLOCKS(s)) ->
        st[c] = (o == O_DELIVERED -> DELIVERED : DEAD);
        wasdead[c] = wasdead[c] || o == O_DEAD;
        /* MOVE_HEADS_SQL: a head on c moves to the first live delivery;
           with none, the head on c is deleted */
        if
        :: head[H(s,k)] == i ->
           first_pending(s, k, r);
           if
           :: r != NONE -> head[H(s,k)] = r
           :: else -> del = 1
           fi
        :: else -> skip
        fi
#ifndef NO_BLOCK_HEAD_CHECK
     :: o == O_DEAD && ONDEAD_BLOCKS(s) && head[H(s,k)] < i ->
        /* an earlier delivery of the stream is still undelivered (its
           lease was taken over after this batch was claimed): this one
           cannot block ahead of it; it is released and waits */
        att[c]--
     :: o == O_DEAD && ONDEAD_BLOCKS(s) && head[H(s,k)] >= i ->
#else
     :: o == O_DEAD && ONDEAD_BLOCKS(s) ->
#endif
        st[c] = DEAD; wasdead[c] = 1; head[H(s,k)] = i; hblk[H(s,k)] = 1
     :: o == O_RETRY -> skip                 /* due again later */
     :: o == O_RELEASE -> att[c]--           /* not tried: not charged */
     fi
  :: else -> skip                            /* lease lost: nothing changes */
  fi;
  r = 0
}

inline drop_head(s, k, i, del) {
  if
  :: del && head[H(s,k)] == i && !hblk[H(s,k)] -> head[H(s,k)] = NONE
  :: else -> skip
  fi;
  del = 0
}

inline crash() {
  /* the worker dies: its in-memory batch is gone; its leases run out
     (expiring at once covers every later expiry: until then nothing can
     claim them) */
  crashes++;
  if :: tok[bat[2*w]] == w -> live[bat[2*w]] = 0 :: else -> skip fi;
  if :: f != NONE && tok[f] == w -> live[f] = 0 :: else -> skip fi;
  bat[2*w] = NONE; bat[2*w+1] = NONE
}

#define CLEAR h = 0; f = 0; ah = 0; af = 0; o1 = 0; o2 = 0; bs = 0; bk = 0; bi = 0

/* One turn after a claim: the plugin call (one step: the sink hands the
   batch to its target in order, and answers one outcome per event), then
   the fenced finish, or a crash instead of it. A crash before the call is
   the same as a crash after a call whose outcomes were all failures, so
   only the later point is modelled. */
inline work() {
  atomic {
    outcome(bs, bk, bi, h, ah, o1);
    if
    :: f != NONE && o1 == O_DELIVERED -> outcome(bs, bk, bi+1, f, af, o2)
    :: f != NONE && o1 != O_DELIVERED -> o2 = O_RELEASE  /* not tried */
    :: else -> skip
    fi
  };
  if
  :: atomic { crashes < MAXCRASH -> crash(); CLEAR }
  :: atomic {
       fin(bs, bk, bi, h, o1, dh);
       if :: f != NONE -> fin(bs, bk, bi+1, f, o2, df) :: else -> skip fi;
#ifndef NO_HEAD_LOCK
       drop_head(bs, bk, bi, dh);
       if :: f != NONE -> drop_head(bs, bk, bi+1, df) :: else -> skip fi;
       bat[2*w] = NONE; bat[2*w+1] = NONE;
       CLEAR
#endif
     }
#ifdef NO_HEAD_LOCK
     /* without the head lock, an ingest may run between the head move
        and the deletion of a head left on a finished delivery */
     atomic {
       drop_head(bs, bk, bi, dh);
       if :: f != NONE -> drop_head(bs, bk, bi+1, df) :: else -> skip fi;
       bat[2*w] = NONE; bat[2*w+1] = NONE;
       CLEAR
     }
#endif
  fi
}

#define CLAIM(s,k,i) :: atomic { ELIG(s,k,i) -> claim(s,k,i) }

/* One worker: a delivery loop that serves either sink, turn by turn. */
proctype worker(byte w) {
  byte h, f, ah, af, o1, o2, bs, bk, bi, j, r;
  bool dh, df;
end:
  if
  CLAIM(0,0,0) CLAIM(0,0,1) CLAIM(0,0,2)
  CLAIM(0,1,0) CLAIM(0,1,1) CLAIM(0,1,2)
  CLAIM(1,0,0) CLAIM(1,0,1) CLAIM(1,0,2)
  CLAIM(1,1,0) CLAIM(1,1,1) CLAIM(1,1,2)
  fi;
  work();
  goto end
}

/* ---- producers: ingest in stream order ---- */
proctype producer() {
  byte i, s;
end:
  do
  :: atomic { ingested[0] < NE -> ingest(0) }
  :: atomic { NS > 1 && ingested[1] < NE -> ingest(1) }
  od
}

/* ---- the clock: a lease running out under a worker still at work ---- */
inline expire(v) {
  slows++;
  if :: tok[bat[2*v]] == v -> live[bat[2*v]] = 0 :: else -> skip fi;
  if :: bat[2*v+1] != NONE && tok[bat[2*v+1]] == v -> live[bat[2*v+1]] = 0 :: else -> skip fi
}

#define BUSY(v) (v <= NW && bat[2*v] != NONE && live[bat[2*v]])

proctype clock() {
end:
  do
  /* When nothing else can move, time passes: an explicit stutter step, so
     that a stuck state is a (fair) cycle the liveness check sees. Spin's
     weak fairness does not count its implicit stutter of a deadlock. */
  :: timeout -> skip
  :: atomic { slows < MAXSLOW && BUSY(1) -> expire(1) }
  :: atomic { slows < MAXSLOW && BUSY(2) -> expire(2) }
  :: atomic { slows < MAXSLOW && BUSY(3) -> expire(3) }
  od
}

/* ---- an operator replaying a dead letter (Store::replay_dead) ---- */
inline replay(s, k, i) {
  replays++;
  st[D(s,k,i)] = PENDING; att[D(s,k,i)] = 0;
  /* reset_head: a head blocked by another dead letter stays */
  if
  :: hblk[H(s,k)] && head[H(s,k)] != i -> skip
  :: else ->
     hblk[H(s,k)] = 0;
     first_pending(s, k, r);
     head[H(s,k)] = r
  fi;
  r = 0
}

#define REPLAY(s,k,i) :: atomic { replays < REPLAYS && k < NS && st[D(s,k,i)] == DEAD -> replay(s,k,i) }

proctype operator() {
  byte r;
end:
  do
  REPLAY(0,0,0) REPLAY(0,0,1) REPLAY(0,0,2)
  REPLAY(0,1,0) REPLAY(0,1,1) REPLAY(0,1,2)
  REPLAY(1,0,0) REPLAY(1,0,1) REPLAY(1,0,2)
  REPLAY(1,1,0) REPLAY(1,1,1) REPLAY(1,1,2)
  od
}

/* ---- nothing lost ---- */

/* (s, k, i) has ended: delivered or dead; or it waits, as documented, for
   an operator: behind a blocking dead letter of its stream, or (chained
   sink) behind an event its `after` sink dead-lettered. */
#define BEHIND_BLOCK(s,k,i) (hblk[H(s,k)] && head[H(s,k)] < i)
#define BEHIND_AFTER_DEAD(s,k,i) ((s) == 1 && (st[D(0,k,0)] == DEAD \
          || (i >= 1 && st[D(0,k,1)] == DEAD) || (i >= 2 && st[D(0,k,2)] == DEAD)))
#ifdef STRICT_LIVENESS
#define ENDED(s,k,i) (k >= NS || i >= NE || st[D(s,k,i)] == DELIVERED || st[D(s,k,i)] == DEAD)
#else
#define ENDED(s,k,i) (k >= NS || i >= NE || st[D(s,k,i)] == DELIVERED || st[D(s,k,i)] == DEAD \
          || BEHIND_BLOCK(s,k,i) || BEHIND_AFTER_DEAD(s,k,i))
#endif
#define SINK_ENDED(s) (ENDED(s,0,0) && ENDED(s,0,1) && ENDED(s,0,2) \
                    && ENDED(s,1,0) && ENDED(s,1,1) && ENDED(s,1,2))
#define ALL_ENDED (ingested[0] == NE && (NS < 2 || ingested[1] == NE) \
                   && SINK_ENDED(0) && SINK_ENDED(1))

/* nothing lost: <> [] ALL_ENDED, under weak fairness (pan -a -f).
   The never claim of its negation, as `spin -f '!<>[]p'` writes it. */
#ifdef LIVENESS
never nothing_lost {
T0_init:
  do
  :: !(ALL_ENDED) -> goto accept_S9
  :: true -> goto T0_init
  od;
accept_S9:
  do
  :: true -> goto T0_init
  od
}
#endif

init {
  byte x;
  atomic {
    x = 0;
    do
    :: x < 4 -> head[x] = NONE; x++
    :: else -> break
    od;
    x = 0;
    do
    :: x < 8 -> bat[x] = NONE; x++
    :: else -> break
    od;
    run producer();
    run clock();
    run operator();
    x = 1;
    do
    :: x <= NW -> run worker(x); x++
    :: else -> break
    od
  }
}
