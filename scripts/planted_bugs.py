#!/usr/bin/env python3
"""The bugs `docs/guarantees.md` names for each durability promise, as edits of the source: planted one at a time
in a scratch copy by scripts/planted_bugs.sh, which checks that the library tests fail against each.

    planted_bugs.py SRC_DIR NAME     plants NAME in the tree under SRC_DIR (its src/)
    planted_bugs.py --list           names the bugs
"""
import sys
plants = {
 # 1. journal answers before its fdatasync
 'reply_before_sync': ('storage/journal/mod.rs',
   """        if self.opts.fsync == FsyncPolicy::Always {
            self.current.borrow_mut().dirty = false;
            if let Err(e) = file.sync().await {""",
   """        let early: Vec<_> = pass.iter().map(|_| ()).collect();
        let _ = early;
        let mut pass = pass;
        for q in pass.iter_mut() {
            let (tx, _) = oneshot::channel();
            let reply = std::mem::replace(&mut q.reply, tx);
            let _ = reply.send(Ok(()));
        }
        if self.opts.fsync == FsyncPolicy::Always {
            self.current.borrow_mut().dirty = false;
            if let Err(e) = file.sync().await {"""),
 # 2. failed journal fdatasync treated as success
 'failed_sync_ignored': ('storage/journal/mod.rs',
   """            if let Err(e) = file.sync().await {
                self.poison("sync", &e);
                for q in pass {
                    let _ = q.reply.send(Err(AppendError::Io(e.to_string())));
                }
                return;
            }""",
   """            if let Err(e) = file.sync().await {
                error!(core = self.core, error = %e, "journal sync failed (ignored)");
            }"""),
 # 3. dead letter settled before its copy is appended
 'dead_letter_settled_first': ('front/consume.rs',
   """            let appended = self
                .produce(ProduceParams {
                    topic: dead_letter.clone(),
                    records: vec![record],
                    batch: false,
                })
                .await;
            match appended {
                Ok(results) if results.iter().all(|r| r.is_ok()) => {
                    if let Err(e) = self
                        .settle_dead_letter(topic, config, group, &d, SettleOp::Ack)
                        .await
                    {""",
   """            let _ = self
                .settle_dead_letter(topic, config, group, &d, SettleOp::Ack)
                .await;
            let appended = self
                .produce(ProduceParams {
                    topic: dead_letter.clone(),
                    records: vec![record],
                    batch: false,
                })
                .await;
            match appended {
                Ok(results) if results.iter().all(|r| r.is_ok()) => {
                    if let Err(e) = OpResult::<()>::Ok(())
                    {"""),
 # 4. rename before the first sync in replace_batch
 'rename_before_sync': ('storage/backend.rs',
   """    if let Err(e) = fs.sync_all().await {
        return all_failed(e);
    }
    let mut renamed_any = false;""",
   """    let mut renamed_any = false;"""),
 # 5. nonce check removed (a stale handle settles)
 'nonce_ignored': ('partition/inflight.rs',
   """        matches!(self.leases.get(&offset), Some(slot) if slot.nonce == nonce)""",
   """        let _ = nonce;
        matches!(self.leases.get(&offset), Some(_slot))"""),
 # 6. replay skips its last entry
 'replay_skips_last': ('storage/journal/replay.rs',
   """        for entry in found.entries {
            report.entries += 1;""",
   """        let last = found.entries.len().saturating_sub(1);
        for (i, entry) in found.entries.into_iter().enumerate() {
            if i == last { continue; }
            report.entries += 1;"""),
}
if sys.argv[1:] == ['--list']:
    print('\n'.join(plants))
    sys.exit(0)
root, name = sys.argv[1].rstrip('/') + '/src/', sys.argv[2]
f,old,new=plants[name]
p=root+f
s=open(p).read()
assert s.count(old)==1, (name, s.count(old))
s=s.replace(old,new)
if name=='rename_before_sync':
    s=s.replace("""    if renamed_any {
        if let Err(e) = fs.sync_all().await {""","""    if let Err(e) = fs.sync_all().await {
        return all_failed(e);
    }
    if renamed_any {
        if let Err(e) = fs.sync_all().await {""")
open(p,'w').write(s)
print('planted', name, 'in', p)
