"""The statements of a teardown batch, timed from Python's sqlite3 on the
store's own schema (its SQLite migrations), N sessions each running turn 1:
what the store writes today, without its read, with the session row and its
timeline segment as one row write, and the asyncio peer's one UPDATE per
session. Each variant runs once untimed, then 7 times inside a transaction that is rolled back;
the medians per session are printed. Usage: python3 teardown_statements.py [N]
(BENCHMARKS.md, "The durable row on a quiet machine")."""
import sqlite3, time, glob, os, json, sys, statistics, tempfile
N=int(sys.argv[1]) if len(sys.argv)>1 else 1000
fk = os.environ.get("FK","1")=="1"
def setup(path):
    if os.path.exists(path): os.remove(path)
    for s in ("-wal","-shm"):
        if os.path.exists(path+s): os.remove(path+s)
    c=sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=NORMAL")
    c.execute("PRAGMA foreign_keys=%s" % ("ON" if fk else "OFF")); c.execute("PRAGMA wal_autocheckpoint=0")
    for f in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'store', 'migrations', 'sqlite', '*', 'up.sql'))):
        c.executescript(open(f).read())
    c.execute("INSERT INTO owners (host,pid,started_at,lease_expires_at) VALUES ('h',1,0,99999999999999)")
    c.execute("BEGIN")
    c.execute("INSERT INTO sessions (id,name,parent,tree,state,created_at,version,owner,open_turn) VALUES (1,'root',NULL,1,'running',0,2,1,1)")
    for i in range(2,N+1):
        c.execute("INSERT INTO sessions (id,name,parent,tree,state,created_at,version,owner,open_turn) VALUES (?,?,1,1,'running',0,2,1,1)",(i,f"agent-{i}"))
    for i in range(1,N+1):
        c.execute("INSERT INTO turns (session,\"no\",started_at,next_seq,input) VALUES (?,1,0,0,NULL)",(i,))
        c.execute("INSERT INTO timeline (session,steps) VALUES (?,?)",(i,json.dumps([[0,None,"registered","registered"],[1,"registered","running","turn_started"]])))
    c.execute("COMMIT")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return c
ids=list(range(1,N+1))
def chunks(l,k=256):
    for i in range(0,len(l),k): yield l[i:i+k]
c=setup(os.path.join(tempfile.mkdtemp(), 'teardown.db'))
try: c.execute("ALTER TABLE sessions ADD COLUMN steps TEXT")
except Exception as e: print(e)
seg=json.dumps([[3,"running","cancelling","cancel:parent_cancelled"],[4,"cancelling","settled","work_exited"],[5,"settled","finalized","finalized:parent_cancelled"]])
def q(ch): return ",".join("?"*len(ch))
def A():
    c.execute("SELECT id,parent,tree,state,outcome,end_reason,open_turn,finalized_at,version,owner,released_at FROM sessions WHERE id BETWEEN 1 AND ?",(N,)).fetchall()
    for ch in chunks(ids):
        c.execute("UPDATE sessions SET state='finalized', outcome='cancelled', end_reason='parent_cancelled', open_turn=NULL, finalized_at=5, version=version+1 WHERE version=2 AND id IN (%s)"%q(ch), ch)
    for ch in chunks(ids):
        c.execute("UPDATE turns SET ended_at=5, outcome='cancelled', error_kind=NULL, error_message=NULL WHERE \"no\"=1 AND ended_at IS NULL AND session IN (%s)"%q(ch), ch)
    for ch in chunks(ids):
        c.execute("INSERT INTO timeline (session,steps) VALUES "+",".join(["(?,?)"]*len(ch)), [x for i in ch for x in (i,seg)])
def A_noselect():
    for ch in chunks(ids):
        c.execute("UPDATE sessions SET state='finalized', outcome='cancelled', end_reason='parent_cancelled', open_turn=NULL, finalized_at=5, version=version+1 WHERE version=2 AND id IN (%s)"%q(ch), ch)
    for ch in chunks(ids):
        c.execute("UPDATE turns SET ended_at=5, outcome='cancelled', error_kind=NULL, error_message=NULL WHERE \"no\"=1 AND ended_at IS NULL AND session IN (%s)"%q(ch), ch)
    for ch in chunks(ids):
        c.execute("INSERT INTO timeline (session,steps) VALUES "+",".join(["(?,?)"]*len(ch)), [x for i in ch for x in (i,seg)])
def B():
    for ch in chunks(ids):
        c.execute("UPDATE sessions SET state='finalized', outcome='cancelled', end_reason='parent_cancelled', open_turn=NULL, finalized_at=5, version=version+1 WHERE state='running' AND owner=1 AND released_at IS NULL AND id IN (%s) RETURNING id"%q(ch), ch).fetchall()
    for ch in chunks(ids):
        c.execute("UPDATE turns SET ended_at=5, outcome='cancelled', error_kind=NULL, error_message=NULL WHERE \"no\"=1 AND ended_at IS NULL AND session IN (%s)"%q(ch), ch)
    for ch in chunks(ids):
        c.execute("INSERT INTO timeline (session,steps) VALUES "+",".join(["(?,?)"]*len(ch)), [x for i in ch for x in (i,seg)])
def C():
    for ch in chunks(ids):
        c.execute("UPDATE sessions SET state='finalized', outcome='cancelled', end_reason='parent_cancelled', open_turn=NULL, finalized_at=5, version=version+1, steps = v.column2 FROM (VALUES "+",".join(["(?,?)"]*len(ch))+") AS v WHERE sessions.id = v.column1 AND state='running' RETURNING sessions.id", [x for i in ch for x in (i,seg)]).fetchall()
    for ch in chunks(ids):
        c.execute("UPDATE turns SET ended_at=5, outcome='cancelled', error_kind=NULL, error_message=NULL WHERE \"no\"=1 AND ended_at IS NULL AND session IN (%s)"%q(ch), ch)
def SEL():
    c.execute("SELECT id,parent,tree,state,outcome,end_reason,open_turn,finalized_at,version,owner,released_at FROM sessions WHERE id BETWEEN 1 AND ?",(N,)).fetchall()
def UPD():
    for ch in chunks(ids):
        c.execute("UPDATE sessions SET state='finalized', outcome='cancelled', end_reason='parent_cancelled', open_turn=NULL, finalized_at=5, version=version+1 WHERE version=2 AND id IN (%s)"%q(ch), ch)
def TURN():
    for ch in chunks(ids):
        c.execute("UPDATE turns SET ended_at=5, outcome='cancelled', error_kind=NULL, error_message=NULL WHERE \"no\"=1 AND ended_at IS NULL AND session IN (%s)"%q(ch), ch)
def TL():
    for ch in chunks(ids):
        c.execute("INSERT INTO timeline (session,steps) VALUES "+",".join(["(?,?)"]*len(ch)), [x for i in ch for x in (i,seg)])
def D():
    for i in ids: c.execute("UPDATE sessions SET state='finalized' WHERE id=?",(i,))
for name,f in [("A current",A),("A without select",A_noselect),("B returning, no select",B),("C one row per session (update from values)",C),("peer",D),("select",SEL),("update",UPD),("turns",TURN),("timeline",TL)]:
    ts=[]
    # One untimed round first: the first statements after the set-up read
    # the pages into SQLite's cache.
    c.execute("BEGIN IMMEDIATE"); f(); c.execute("ROLLBACK")
    for r in range(7):
        c.execute("BEGIN IMMEDIATE"); t0=time.perf_counter(); f(); t1=time.perf_counter(); c.execute("ROLLBACK"); ts.append(t1-t0)
    print(f"{name:45s} {statistics.median(ts)*1e6/N:6.2f} us/session (min {min(ts)*1e6/N:.2f})")
