import csv,collections,sys
lines=open(sys.argv[1]).read().splitlines()
i=next(j for j,l in enumerate(lines) if l.startswith('"ID"'))
rows=list(csv.reader(lines[i:]))
h=rows[0]; ki=h.index('Kernel Name'); gi=h.index('Grid Size'); mi=h.index('Metric Name'); vi=h.index('Metric Value')
d=collections.defaultdict(list); order=[]
for r in rows[1:]:
  if len(r)<=vi: continue
  n=r[ki].replace('void unnamed>::','').split('(')[0]
  k=(n,r[gi],r[mi][:48])
  if k not in d: order.append(k)
  try: d[k].append(float(r[vi].replace(',','')))
  except ValueError: d[k].append(float('nan'))
for k in order: v=d[k]; print('%-45s %-16s %-48s %10.3f %d'%(k[0],k[1],k[2],sum(v)/len(v),len(v)))
