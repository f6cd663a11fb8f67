"""csconsumer.py — what the change stream failover and chaos scripts share, on top of cslib.py:
Checks (the failures a script found, its exit status) and Stream (a table with change streams
on, the `strata changes --follow --checkpoint` consumer reading it, the writes acknowledged to
it, and the waits on what the consumer printed and on its checkpoint's tokens)."""
import json, os, signal, subprocess, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import BT, call, create_cs, create_profile, fld, now_us, rfc3339, set_cell, tname


class Checks:
    """The failures found so far, each printed as it is found; exit() ends the script on them."""

    def __init__(self):
        self.failures = []

    def fail(self, msg):
        print('FAIL: ' + msg); self.failures.append(msg)

    def expect(self, what, ok, detail=''):
        print(('ok: %s %s' % (what, detail)) if ok else 'FAIL: %s %s' % (what, detail))
        if not ok: self.failures.append(what)

    def exit(self):
        print('FAIL' if self.failures else 'PASS')
        sys.exit(1 if self.failures else 0)


class Stream(Checks):
    """Table prefix+N of the instance in d (router port), read by one consumer at a time whose
    output, checkpoint and error files are d/TABLE.jsonl, .ck and .err. With profile (a prefix),
    consumer and writer use the app profile profile+TABLE; writer_profile may be set apart."""

    def __init__(self, port, d, strata, prefix, profile=None, rows=None):
        Checks.__init__(self)
        self.port, self.d, self.strata = port, d, strata
        self.table = prefix + '%d' % (now_us() % 100000)
        self.profile = profile + self.table if profile else None
        self.writer_profile = self.profile
        self.rows = rows or ['r%02d' % i for i in range(8)]
        self.out_path, self.ck_path, self.err_path = [os.path.join(d, self.table + s)
                                                      for s in ('.jsonl', '.ck', '.err')]
        self.acked = []  # 'row=value' of every acknowledged write()
        self.consumer = None
        self.t0_text = None  # the consumer's --from, set when it is first started

    def run(self, *args):
        """`strata ARGS --dir d`, a failure when it does not succeed."""
        r = subprocess.run([self.strata] + list(args) + ['--dir', self.d], capture_output=True, text=True)
        print('strata %s: %d %s' % (' '.join(args), r.returncode, (r.stdout + r.stderr).strip()[-200:]))
        if r.returncode: self.fail('strata %s failed' % ' '.join(args))

    def make_profile(self, name, cluster):
        print('profile', name, create_profile(self.port, name, cluster)[1:])

    def create(self):
        print('create', create_cs(self.port, self.table)[1:])

    def write(self, n):
        """n writes through writer_profile, one after another, each to the next of rows; each
        acknowledged one is remembered, one never acknowledged is a failure."""
        for _ in range(n):
            seq = len(self.acked)
            row = self.rows[seq % len(self.rows)]
            body = fld(1, tname(self.table)) + (fld(4, self.writer_profile) if self.writer_profile else b'') + \
                fld(2, row) + fld(3, set_cell('cf', 'q', 'v%05d' % seq))
            for attempt in range(50):
                data, st, why = call(self.port, BT + 'MutateRow', body, limit=20)
                if why == 'end' and len(data) >= 5: self.acked.append('%s=v%05d' % (row, seq)); break
                time.sleep(0.1)
            else:
                self.fail('write %d was never acknowledged: %s' % (seq, st))

    def start_consumer(self):
        """Starts the consumer, from its checkpoint when it has one, else from the time of its
        first start (taken then)."""
        if self.t0_text is None:
            self.t0_text = rfc3339(now_us())
            time.sleep(0.01)
        outf = open(self.out_path, 'ab')
        self.consumer = subprocess.Popen(
            [self.strata, 'changes', '--dir', self.d, '--table', self.table, '--follow', '--checkpoint',
             self.ck_path, '--from', self.t0_text, '--heartbeat-s', '1', '--quiet'] +
            (['--app-profile', self.profile] if self.profile else []),
            stdout=outf, stderr=open(self.err_path, 'ab'))
        outf.close()

    def ended_by_itself(self):
        """A failure when the consumer is no longer running (with --follow it never ends)."""
        if self.consumer.poll() is None: return False
        self.fail('the consumer ended by itself (status %d): %s' %
                  (self.consumer.returncode, open(self.err_path).read()[-500:]))
        return True

    def kill_consumer(self, why):
        self.ended_by_itself()
        self.consumer.send_signal(signal.SIGKILL); self.consumer.wait()
        print('kill -9 the consumer; ' + why)

    def stop_consumer(self):
        if not self.ended_by_itself():
            self.consumer.send_signal(signal.SIGTERM); self.consumer.wait()

    def printed(self):
        """(row, value) of every cell value the consumer printed, in its order."""
        out = []
        for line in open(self.out_path, 'rb'):
            try: j = json.loads(line)
            except ValueError: continue  # a line cut by kill -9: printed again after the checkpoint
            out += [(j['row'], m['value']) for m in j.get('mods', []) if 'value' in m]
        return out

    def seen(self):
        return set('%s=%s' % rv for rv in self.printed())

    def wait_printed(self, what, want=None, tries=300):
        """Until every 'row=value' of want (default: every acknowledged write) was printed; a
        failure when the consumer ends meanwhile, or when it is not done in tries tenths of a
        second (a hang guard, not a timing check)."""
        want = set(self.acked) if want is None else want
        for _ in range(tries):
            if want <= self.seen(): return
            if self.ended_by_itself(): return
            time.sleep(0.1)
        missing = sorted(want - self.seen())
        self.fail('%s: %d acknowledged writes never printed: %s' % (what, len(missing), missing[:12]))

    def checkpoint_tokens(self):
        """The tokens of the checkpoint file, each split at its dots; [] while there is none."""
        try:
            lines = open(self.ck_path).read().split('\n')[1:]
        except OSError:
            return []
        toks = [bytes.fromhex(p[3]).decode().split('.') for p in map(str.split, lines) if len(p) == 4 and p[0] == 't']
        return [tok[1:] if tok[0].startswith('t') else tok for tok in toks]  # without the table tag

    def checkpoint_times(self):
        """The W (microseconds) of every token of the checkpoint file."""
        return [int(tok[1] if tok[0] == '1' else tok[3]) for tok in self.checkpoint_tokens()]

    def checkpoint_bounds(self):
        """The Y of every version 2 token of the checkpoint file (None for a version 1 token)."""
        return [int(tok[2]) if tok[0] == '2' else None for tok in self.checkpoint_tokens()]

    def wait_tokens_pass(self, t, what):
        """Until every token of the consumer's checkpoint is past t (heartbeats move them on)."""
        for _ in range(300):  # hang guard, not a timing check
            times = self.checkpoint_times()
            if times and min(times) > t: return
            time.sleep(0.1)
        self.fail('the checkpoint never passed %s: %s' % (what, self.checkpoint_times()))

    def finish(self):
        """Stops the consumer, says how much it printed, and ends the script."""
        self.stop_consumer()
        lines = sum(1 for line in open(self.out_path, 'rb') if line.startswith(b'{'))
        print('%d acknowledged writes, %d printed, in %d changes (the rest again: at least once)' %
              (len(self.acked), len(set(self.acked) & self.seen()), lines))
        self.exit()
